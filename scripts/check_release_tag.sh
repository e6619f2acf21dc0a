#!/usr/bin/env bash
# On a release tag, the tag must be "v" + the package version (python/linrec/_version.py).
#   bash scripts/check_release_tag.sh [REF]   REF: a tag (v0.1.0) or a git ref (refs/tags/v0.1.0);
#                                            default $GITHUB_REF. Any other ref: nothing to check.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:-${GITHUB_REF:-}}
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' python/linrec/_version.py)
[ -n "$version" ] || { echo "no __version__ in python/linrec/_version.py"; exit 1; }
case $ref in
  refs/tags/*) tag=${ref#refs/tags/} ;;
  refs/*|"") echo "not a tag (${ref:-no ref}): package version $version, nothing to check"; exit 0 ;;
  *) tag=$ref ;;
esac
if [ "$tag" != "v$version" ]; then
  echo "tag $tag does not match the package version $version (python/linrec/_version.py): expected v$version"
  exit 1
fi
echo "tag $tag matches the package version $version"
