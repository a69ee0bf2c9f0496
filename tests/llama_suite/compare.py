"""Reads the two JUnit reports of scripts/llama-suite (llama-server's and llmgate's run of
llama.cpp's server tests) and prints passed/failed per file side by side, then every test
llama-server passes and llmgate fails. Exits 1 when such a test is not in EXCEPTIONS
(exceptions.py), or when a listed one names no test the suite ran (a wrong name); also
when llama-server passed far fewer than it does (it did not run) or the two runs ran
different tests. A listed test llmgate passed this time, or llama-server did not, is
reported, not failed (the suite samples without a seed, and the draw moves with the
CPU). The list says exactly what llmgate does not do.

    python3 compare.py LLAMA_SERVER.xml LLMGATE.xml
"""

import collections
import sys
import xml.etree.ElementTree as ET

from exceptions import EXCEPTIONS


def outcomes(report: str) -> dict[str, str]:
    """`file::test` → passed, failed or skipped."""
    result = {}
    for case in ET.parse(report).iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        name = f"{path.removeprefix('unit/')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            result[name] = "failed"
        elif case.find("skipped") is not None:
            result[name] = "skipped"
        else:
            result[name] = "passed"
    return result


# llama-server passes 133 of the 178 selected tests on our model: far fewer means it did
# not run (a broken build, a launcher fault), and the comparison would prove nothing.
PEER_PASSES_AT_LEAST = 110


def main(peer_report: str, ours_report: str) -> int:
    peer, ours = outcomes(peer_report), outcomes(ours_report)
    if set(peer) != set(ours):
        print(f"the two runs ran different tests: {sorted(set(peer) ^ set(ours))[:10]}")
        return 1
    peer_passed = sum(o == "passed" for o in peer.values())
    if peer_passed < PEER_PASSES_AT_LEAST:
        print(f"llama-server passed {peer_passed} tests, fewer than {PEER_PASSES_AT_LEAST}: "
              "it did not run as it should (see its log)")
        return 1
    per_file = collections.defaultdict(lambda: collections.Counter())
    for name, outcome in peer.items():
        per_file[name.split("::")[0]][("llama-server", outcome)] += 1
    for name, outcome in ours.items():
        per_file[name.split("::")[0]][("llmgate", outcome)] += 1
    print(f"{'file':28} {'llama-server':>18} {'llmgate':>18}")
    for path in sorted(per_file):
        counts = per_file[path]
        cells = [f"{counts[(s, 'passed')]} passed {counts[(s, 'failed')]} failed" for s in ("llama-server", "llmgate")]
        print(f"{path:28} {cells[0]:>18} {cells[1]:>18}")
    totals = [collections.Counter(r.values()) for r in (peer, ours)]
    print(f"{'all':28} {totals[0]['passed']:>6} passed {totals[0]['failed']:>3} failed"
          f" {totals[1]['passed']:>6} passed {totals[1]['failed']:>3} failed")

    behind = sorted(n for n, o in peer.items() if o == "passed" and ours.get(n) != "passed")
    unexplained = [n for n in behind if not excepted(n)]
    # Listed for nothing: it names no test the suite ran (a typo, a test renamed or
    # gone). One llama-server did not pass this time, or llmgate passed, is only
    # reported: the suite samples at temperature 0.8, and where its answers depend on the
    # draw (and so on the CPU's floating point) a listed test may pass or fail by chance
    # on either server (an answer that did not end early).
    peer_passes = [n for n, o in peer.items() if o == "passed"]
    stale = sorted(key for key in EXCEPTIONS if not any(matches(key, n) for n in peer))
    unpassed = sorted(key for key in EXCEPTIONS if key not in stale
                      and not any(matches(key, n) for n in peer_passes))
    passing = sorted(key for key in EXCEPTIONS if key not in stale and key not in unpassed
                     and not any(matches(key, n) for n in behind))
    print(f"\nllama-server passes, llmgate does not: {len(behind)} "
          f"({len(behind) - len(unexplained)} listed in tests/llama_suite/exceptions.py)")
    for name in behind:
        reason = next((r for k, r in EXCEPTIONS.items() if matches(k, name)), None)
        print(f"  {'listed ' if reason else 'MISSING'} {name}" + (f": {reason}" if reason else ""))
    for name in stale:
        print(f"  STALE   {name}: listed, but names no test the suite ran")
    for name in unpassed:
        print(f"  unpassed {name}: listed, and llama-server did not pass it this time (by "
              "chance, or it fails on this machine: remove it if it never passes)")
    for name in passing:
        print(f"  passed  {name}: listed, yet llmgate passed it this time (fixed, or by "
              "chance: remove it once it always passes)")
    return 1 if unexplained or stale else 0


def matches(key: str, name: str) -> bool:
    """An exception names a test, or every parametrization of one (no brackets)."""
    return name == key or ("[" not in key and name.startswith(key + "["))


def excepted(name: str) -> bool:
    return any(matches(k, name) for k in EXCEPTIONS)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
