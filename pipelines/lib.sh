# Shared helpers of the pipelines: tool paths, run-and-echo, and docs/RESULTS.md sections.
# Sourced by the pipeline scripts; every tool is called exactly as a user would call it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${GRADKIT_BIN:-$ROOT/target/release}
FAST=${FAST:-0}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for t in gradtrace gradselect gradpartition gradallreduce gradtrain gradreport; do
  [ -x "$B/$t" ] || { echo "error: $B/$t is not built (run 'make build')" >&2; exit 1; }
done

# run CMD…: print the command (as a user would type it) to stderr, then run it.
run() {
  printf '+ %s\n' "$*" | sed "s#$B/##g" >&2
  "$@"
}

# section NAME FILE: put FILE between the NAME markers of docs/RESULTS.md (full runs only;
# FAST runs keep the section next to their outputs so `make test` leaves the tree clean).
section() {
  local name=$1 file=$2 doc=$ROOT/docs/RESULTS.md
  if [ "$FAST" != 0 ]; then
    cp "$file" "$(dirname "$file")/RESULTS-section.md"
    return
  fi
  python3 - "$doc" "$name" "$file" <<'PY'
import sys, re
doc, name, new = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
text = open(doc).read()
begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
block = f"{begin}\n{new.rstrip()}\n{end}"
if begin in text and end in text:
    text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda m: block, text, flags=re.S)
else:
    text = text.rstrip() + "\n\n" + block + "\n"
open(doc, "w").write(text)
PY
  echo "updated docs/RESULTS.md section '$name'" >&2
}

# expect FILE PATTERN…: fail unless every pattern occurs in FILE (the FAST runs in `make test`
# check that each reproduction's tables have the rows they should).
expect() {
  local file=$1; shift
  local p
  for p in "$@"; do
    grep -qE -- "$p" "$file" || { echo "error: $(basename "$PWD")/$(basename "$file") lacks the row /$p/" >&2; exit 1; }
  done
}
