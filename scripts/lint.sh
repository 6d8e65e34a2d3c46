#!/usr/bin/env bash
# Checks the code habits on the product's sources (common cmd config fence_store election_client
# proxy; not tests): the format (.clang-format, clang-format-16), the clang-tidy profile
# (.clang-tidy, clang-tidy-16 over every product .cpp, two at a time), and the module rules of
# docs/ARCHITECTURE.md (who may include whom; only fence_store includes sqlite3.h). Prints each
# finding; exits 0 iff everything is clean, 1 otherwise.
#   scripts/lint.sh                      all three (CI runs this after scripts/test.sh)
#   scripts/lint.sh format|tidy|modules  one of them
#   FENCEGATE_LINT_JOBS=N                clang-tidy processes at once (default 2)
# clang-tidy reads build/compile_commands.json; if there is none, build/ is configured (not built:
# nothing is generated). To fix the format in place: clang-format-16 -i FILES.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh >/dev/null  # clang-format-16 and clang-tidy-16 among the rest, if missing

what="${1:-all}"
case "$what" in all|format|tidy|modules) ;; *) echo "usage: scripts/lint.sh [format|tidy|modules]" >&2; exit 2 ;; esac
jobs="${FENCEGATE_LINT_JOBS:-2}"

dirs=()
for d in common cmd config fence_store election_client proxy; do [ -d "$d" ] && dirs+=("$d"); done
mapfile -t sources < <(find "${dirs[@]}" -type f \( -name '*.cpp' -o -name '*.h' \) | sort)
# The slow ones first (those that include Boost or nlohmann_json, largest first), so that the
# clang-tidy processes finish at about the same time.
mapfile -t units < <(cpps=$(printf '%s\n' "${sources[@]}" | grep '\.cpp$')
                     grep -lE 'include <(boost|nlohmann)/' $cpps | xargs -r ls -S; grep -LE 'include <(boost|nlohmann)/' $cpps | xargs -r ls -S)

failed=()
start=$(date +%s)
say() { echo "lint: $*" >&2; }

if [ "$what" = all ] || [ "$what" = format ]; then
  say "clang-format: ${#sources[@]} files"
  if ! clang-format-16 --dry-run -Werror "${sources[@]}"; then failed+=(format); fi
fi

if [ "$what" = all ] || [ "$what" = modules ]; then
  say "module rules: who includes whom"
  # module -> the fencegate folders its sources may include (docs/ARCHITECTURE.md)
  declare -A may=(
    [common]="common"
    [config]="common config"
    [fence_store]="common fence_store"
    [election_client]="common election_client"
    [proxy]="common config fence_store election_client proxy"
    [cmd]="common config fence_store election_client proxy cmd"
  )
  bad=0
  for d in "${dirs[@]}"; do
    while IFS= read -r hit; do
      file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}
      inc=$(sed -E 's/^[^"]*"([a-z_]+)\/.*/\1/' <<<"$rest")
      case " ${may[$d]} " in *" $inc "*) ;; *) echo "$file:$line: $d/ may not include $inc/ (docs/ARCHITECTURE.md)"; bad=1 ;; esac
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"(common|cmd|config|fence_store|election_client|proxy)/' \
               -r "$d" --include='*.cpp' --include='*.h' || true)
  done
  while IFS= read -r hit; do
    echo "$hit: only fence_store/ may include sqlite3.h (docs/ARCHITECTURE.md)"; bad=1
  done < <(grep -rnE '#[[:space:]]*include[[:space:]]*[<"]sqlite3\.h[>"]' --include='*.cpp' --include='*.h' \
             "${dirs[@]}" | grep -v '^fence_store/' | cut -d: -f1,2 || true)
  [ "$bad" -eq 0 ] || failed+=(modules)
fi

if [ "$what" = all ] || [ "$what" = tidy ]; then
  if [ ! -f build/compile_commands.json ]; then
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  fi
  say "clang-tidy: ${#units[@]} translation units, $jobs at a time"
  # Each file's findings are printed whole once it is done, so parallel output does not interleave.
  if ! printf '%s\n' "${units[@]}" | xargs -P "$jobs" -I{} sh -c '
      out=$(clang-tidy-16 -p build --quiet --warnings-as-errors="*" "$1" 2>&1) && exit 0
      printf "%s\n" "$out" | grep -v "warnings\? generated\.$" >&2; exit 1' _ {}; then
    failed+=(tidy)
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  say "FAILED: ${failed[*]} ($(( $(date +%s) - start )) s)"
  exit 1
fi
say "clean ($(( $(date +%s) - start )) s)"
