#!/usr/bin/env bash
# The C ABI: the committed header compiles as C99 and C++ (-Wall -Wextra -Werror), the
# example (examples/c/chat.c) builds against the static library with the system C
# compiler, runs a two-turn greedy chat on SmolLM2 whose replies must equal the Rust
# CLI's (`kvcore chat --greedy -n 64` on the same two lines), whose second turn must
# reuse the first's positions, and which runs clean under AddressSanitizer and
# LeakSanitizer (a deliberately leaking program must be reported, or the check is void).
# The header's drift check is a cargo test (capi/header/tests/header.rs), run by the README's
# test command.
#
# Usage: .ci/capi.sh   (builds with .ci/build-native.sh; the model is fetched if needed)
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/capi-ci
mkdir -p "$out"
bash .ci/build-native.sh  # target/release/libkvcore_c.a and kvcore
lib=target/release/libkvcore_c.a
libs=(-lpthread -ldl -lm)

echo "--- header: C99 and C++"
cc -std=c99 -pedantic -Wall -Wextra -Werror -Icapi/include capi/tests/c/header_check.c "$lib" "${libs[@]}" -o "$out/header_c"
c++ -x c++ -std=c++11 -pedantic -Wall -Wextra -Werror -Icapi/include capi/tests/c/header_check.c -x none "$lib" "${libs[@]}" -o "$out/header_cxx"
"$out/header_c" >/dev/null
"$out/header_cxx" >/dev/null

echo "--- the example against the static library, beside the Rust CLI"
cc -std=c99 -pedantic -Wall -Wextra -Werror -O2 -Icapi/include examples/c/chat.c "$lib" "${libs[@]}" -o "$out/chat"
"$out/chat" smollm2 >"$out/chat.out" 2>"$out/chat.err" || { cat "$out/chat.err"; exit 1; }
cat "$out/chat.out" "$out/chat.err"
printf 'What is the capital of France?\nAnd of Italy?\n' |
    target/release/kvcore chat --greedy -n 64 smollm2 >"$out/cli.out" 2>"$out/cli.err"
if ! diff -u "$out/cli.out" "$out/chat.out"; then
    echo "the C example's replies differ from kvcore chat's" >&2
    exit 1
fi
[ -s "$out/chat.out" ] || { echo "the C example printed no reply" >&2; exit 1; }
if ! grep -Eq '^\[turn 2 \| [1-9][0-9]* positions reused' "$out/chat.err"; then
    echo "the second turn did not reuse the first turn's cache" >&2
    exit 1
fi

echo "--- the README's C snippet, as written"
awk '/<!-- ci: readme.c -->/ {on = 1; next} on && /^```c$/ {inside = 1; next}
     inside && /^```$/ {exit} inside {print}' README.md >"$out/readme.c"
[ -s "$out/readme.c" ] || { echo "README has no C snippet after <!-- ci: readme.c -->" >&2; exit 1; }
cc -std=c99 -Wall -Wextra -Werror -Icapi/include "$out/readme.c" "$lib" "${libs[@]}" -o "$out/readme"
"$out/readme" | tee "$out/readme.out"
grep -q "Paris" "$out/readme.out"

echo "--- AddressSanitizer and LeakSanitizer"
asan=(-g -fsanitize=address -fno-omit-frame-pointer)
cc -std=c99 -Wall -Wextra -Werror "${asan[@]}" -Icapi/include capi/tests/c/leak.c "$lib" "${libs[@]}" -o "$out/leak"
if ASAN_OPTIONS=detect_leaks=1 "$out/leak" 2>"$out/leak.err"; then
    echo "LeakSanitizer did not report the deliberate leak: the ASan check would prove nothing" >&2
    exit 1
fi
grep -q "LeakSanitizer: detected memory leaks" "$out/leak.err"
cc -std=c99 -Wall -Wextra -Werror "${asan[@]}" -Icapi/include examples/c/chat.c "$lib" "${libs[@]}" -o "$out/chat-asan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$out/chat-asan" smollm2 >"$out/chat-asan.out" 2>"$out/chat-asan.err" ||
    { cat "$out/chat-asan.err"; exit 1; }
diff -u "$out/cli.out" "$out/chat-asan.out"
echo "C ABI: header, example, Rust CLI agreement and ASan/LSan all pass"
