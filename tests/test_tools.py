"""Development tools under tools/ that need no GPU."""

from tools import tests_not_run


def test_tests_not_run_lists_what_the_junit_file_lacks(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">'
        '<testcase classname="tests.test_gpu" name="test_a[1e-12-cuda:1]" time="1.0"/>'
        '<testcase classname="tests.test_gpu.TestGroup" name="test_b" time="1.0"><failure message="x"/></testcase>'
        '<testcase classname="" name="interrupted" time="0"/>'
        '</testsuite></testsuites>')
    collected = ["tests/test_gpu.py::test_a[1e-12-cuda:1]", "tests/test_gpu.py::test_a[1e-05-cuda]",
                 "tests/test_gpu.py::TestGroup::test_b", "tests/test_cpu.py::test_c", "", "5 tests collected"]
    assert tests_not_run.not_run(collected, str(junit)) == ["tests/test_gpu.py::test_a[1e-05-cuda]",
                                                            "tests/test_cpu.py::test_c"]
