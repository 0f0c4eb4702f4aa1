#!/usr/bin/env python3
"""What infra/test.sh prints of a run, read from nextest's JUnit reports.

  test-report.py lane NAME STATUS JUNIT SKIPPED   one line: the lane's tests passed, failed, skipped
  test-report.py end TIER PHASES JUNIT...         the time of each phase and the ten slowest test files
"""
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def cases(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    return root.iter("testcase")


def lane(name, status, junit, skipped_file):
    passed = failed = 0
    for case in cases(junit):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        else:
            passed += 1
    try:
        with open(skipped_file) as f:
            skipped = sorted({line.strip() for line in f if line.strip()})
    except OSError:
        skipped = []
    verdict = "green" if status == "0" else f"RED, exit {status}"
    print(f"== lane {name}: {passed - len(skipped)} passed, {failed} failed, {len(skipped)} skipped ({verdict})")
    for line in skipped:
        print(f"   {line}")


def end(tier, phases, junits):
    print(f"== tier {tier}: time by phase")
    with open(phases) as f:
        for line in f:
            phase, seconds = line.split()
            print(f"   {phase:<12} {int(seconds) // 60:3d} min {int(seconds) % 60:02d} s")
    files = defaultdict(float)
    for junit in junits:
        lane = junit.rsplit("/", 1)[-1].removesuffix(".xml")
        for case in cases(junit):
            files[f"{lane}: {case.get('classname')}"] += float(case.get("time") or 0)
    print("== the ten slowest test files (test time, summed over their tests)")
    for name, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:10]:
        print(f"   {seconds:8.1f} s  {name}")


if __name__ == "__main__":
    if sys.argv[1] == "lane":
        lane(*sys.argv[2:6])
    elif sys.argv[1] == "end":
        end(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)
