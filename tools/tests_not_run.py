"""The tests of a pytest run that a JUnit XML file does not list: the rest of a suite cut off by a
time limit, to run in a second call.

Reads the node ids that `pytest --collect-only -q` prints (stdin) and prints those that no given
XML has a <testcase> for, one a line, as pytest takes them:

    python -m pytest --collect-only -q tests | python -m tools tests-not-run junit.xml [more.xml]
"""

import argparse
import sys
import xml.etree.ElementTree as ET


def node_id(classname: str, name: str) -> str | None:
    """pytest's node id of a JUnit test case: classname tests.test_x (or tests.test_x.Class), name
    test_y[params]; None for an entry of no test module (an interrupted run's)."""
    parts = classname.split(".")
    # The module is the last part starting with test_; what follows is a test class.
    modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
    if not modules:
        return None
    return "::".join(["/".join(parts[:modules[-1] + 1]) + ".py", *parts[modules[-1] + 1:], name])


def listed(junit_path: str) -> set[str]:
    return {node_id(case.get("classname", ""), case.get("name", ""))
            for case in ET.parse(junit_path).getroot().iter("testcase")}


def not_run(collected: list[str], *junit_paths: str) -> list[str]:
    """The collected ids (in their order) with no test case in any of the JUnit files."""
    done = set().union(*map(listed, junit_paths))
    return [line for line in collected if "::" in line and line not in done]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools tests-not-run", description=__doc__.splitlines()[0])
    parser.add_argument("junit", nargs="+", help="the JUnit XML files of the runs so far")
    args = parser.parse_args(argv)
    collected = [line.strip() for line in sys.stdin]
    for test in not_run(collected, *args.junit):
        print(test)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
