"""``unigrad check --conformance NAME``: the conformance suite itself -- the very tests that
``pytest --pyargs unigrad.testing.conformance --unigrad-backends=NAME`` runs -- run by pytest in this
process and reported as a table, one row per rule (test function), so the table and pytest can never
disagree about a backend."""

from __future__ import annotations

import collections
import contextlib
import importlib.metadata
import io
import os

PLUGIN = "unigrad.testing._pytest_plugin"
OUTCOMES = ("passed", "failed", "skipped", "xfailed")


class _Outcomes:
    """A pytest plugin that keeps one outcome per test: its failure (setup, call or teardown), else its
    skip or expected failure, else a pass."""

    def __init__(self):
        self.tests: dict[str, tuple[str, str]] = {}

    def pytest_runtest_logreport(self, report):
        if report.outcome == "passed" and not hasattr(report, "wasxfail"):
            if report.when == "call":
                self.tests.setdefault(report.nodeid, ("passed", ""))
            return
        if report.failed:
            self.tests[report.nodeid] = ("failed", _message(report))
        elif hasattr(report, "wasxfail"):
            self.tests[report.nodeid] = ("xfailed", report.wasxfail)
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.tests[report.nodeid] = ("skipped", reason.removeprefix("Skipped: "))

    def pytest_collectreport(self, report):
        if report.failed:  # the module itself did not import: no test ran at all
            self.tests[report.nodeid or "collection"] = ("failed", _message(report))


def _message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= 160 else line[:157] + "..."


def _plugin_loads_itself() -> bool:
    """Whether pytest will load unigrad's plugin from its entry point (installed unigrad, autoload on)."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(ep.value == PLUGIN for ep in importlib.metadata.entry_points(group="pytest11"))


def run(backend: str, select: str | None = None) -> tuple[str, bool]:
    """Run the conformance suite against ``backend`` (its tests whose names match the pytest ``-k``
    expression ``select``, all by default); return the report and whether every test passed (skips and
    expected failures allowed, a run that collected nothing is not a pass)."""
    import pytest

    outcomes = _Outcomes()
    args = ["--pyargs", "unigrad.testing.conformance", f"--unigrad-backends={backend}", "-q",
            "-p", "no:cacheprovider", "-p", "no:randomly"]
    if not _plugin_loads_itself():
        args += ["-p", PLUGIN]
    if select:
        args += ["-k", select]
    # pytest's own output (under the options of the directory's pytest configuration, as a plain pytest
    # run there would have them) is kept back: the table says the same; shown where pytest itself failed
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = pytest.main(args, plugins=[outcomes])
    text = report(backend, outcomes.tests, select)
    if int(code) not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
        text += f"\n\npytest stopped ({pytest.ExitCode(code).name}):\n" + printed.getvalue()[-4000:]
    return text, int(code) == 0 and bool(outcomes.tests)


def report(backend: str, tests: dict[str, tuple[str, str]], select: str | None = None) -> str:
    """The table of one run: per rule the counts of each outcome, then each failure with its message,
    then the reasons for skips, then the verdict."""
    rules: dict[str, collections.Counter] = {}
    for nodeid, (outcome, _) in tests.items():
        rule = nodeid.rpartition("::")[2].partition("[")[0] or nodeid
        rules.setdefault(rule, collections.Counter())[outcome] += 1
    total = collections.Counter(outcome for outcome, _ in tests.values())
    width = max([len(r) for r in rules] + [len("rule")])
    scope = f", tests matching {select!r}" if select else ""
    lines = [f"unigrad conformance: backend {backend!r} ({len(tests)} tests of {len(rules)} rules{scope}; "
             f"the tests of pytest --pyargs unigrad.testing.conformance --unigrad-backends={backend})",
             f"{'rule':<{width}}  " + "  ".join(f"{o:>7}" for o in OUTCOMES),
             "-" * width + "  " + "  ".join("-" * 7 for _ in OUTCOMES)]
    for rule, counts in rules.items():
        lines.append(f"{rule:<{width}}  " + "  ".join(f"{counts[o] or '':>7}" for o in OUTCOMES))
    failed = [(nodeid, why) for nodeid, (outcome, why) in tests.items() if outcome == "failed"]
    if failed:
        lines += ["", "failed:"] + [f"  {nodeid.lstrip(':')}: {why}" for nodeid, why in failed]
    skips = collections.Counter(why for outcome, why in tests.values() if outcome == "skipped")
    if skips:
        lines += ["", "skipped (how many: why):"] + [f"  {n}: {why}" for why, n in skips.most_common()]
    verdict = "PASS" if tests and not failed else "FAIL"
    if not tests:
        lines.append("\nno test ran")
    lines.append(f"\noverall: {verdict} ({', '.join(f'{total[o]} {o}' for o in OUTCOMES if total[o])})")
    return "\n".join(lines)
