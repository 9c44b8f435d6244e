"""The conformance suite itself: the reference passes through the adapter path, the
field-shaped example fails where it is known to be wrong, and the CLI and the pytest
plugin behave as documented."""

import json
import os
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.conformance import Adapter, AdapterError, load_adapter
from kvspec.conformance.adapter.protocols import LayoutsProtocol, RoutingProtocol
from kvspec.conformance.checks import all_checks
from kvspec.conformance.domain import Domain
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import (
    FAILED,
    INCONCLUSIVE,
    NOT_PROVIDED,
    PASSED,
    run_suite,
    select_checks,
)
from kvspec.conformance.skips import MAX_SKIPS_BYTES, read_skips, resolve_skips
from kvspec.core.clauses import all_clauses
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from tests.paths import ROOT

pytest_plugins = ["pytester"]
# Import every check module now: in-process pytester runs drop modules they imported,
# and a check module imported again would register its checks twice.
ALL_CHECKS = all_checks()


pytestmark = pytest.mark.usefixtures("ci_profile")  # the checks run under ci


FAMILIES = sorted({check.clause.split("-")[0] for check in all_checks()})


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reference_passes_every_check(device: str, family: str) -> None:
    """The whole suite, a clause family per test (so the workers share it)."""
    report = run_suite(load_adapter("reference"), device=device, patterns=[family])
    failed = {r.check.id: r.reason for r in report.results if r.verdict != PASSED}
    assert not failed
    assert {r.check.id for r in report.results} == {
        c.id for c in all_checks() if c.clause.split("-")[0] == family
    }


def test_every_clause_family_has_checks() -> None:
    families = {c.family for c in all_clauses().values()}
    checked = {ch.clause.split("-")[0] for ch in all_checks()}
    assert families == checked


def test_the_field_shaped_module_fails_its_known_bugs() -> None:
    report = run_suite(load_adapter("examples.field_adapter:adapter"))
    verdicts = {r.check.id: r.verdict for r in report.results}
    known_bugs = {
        "PLAN-2/exact-cover": "takes a replicated head from every replica",
        "RESHARD-2/round-trip": "so the merged shard has too many heads",
        "SLICE-1/sender-content": "slicing one head into several slices raises",
        "SLICE-3/refuses-other-rank": "a payload for another rank is only warned about",
        "STAGE-1/refuses-rank-out-of-range": "local_rank >= tp is accepted",
        "LAYOUT-1/read-named": "a stacked cache is read by guessing from its shape",
        "LAYOUT-1/refuses-unknown-name": "the layout's name is never read",
        "KEY-3/injective": "a legacy key and a rank-aware key can be the same string",
        "KEY-3/refuses-outside-domain": "any request id and field is joined with '_'",
        "PORT-3/deployment-distinct": "the port formula has no replica term",
        "PORT-2/refuses-outside-domain": "stage 16 of rank 0 is accepted (rank 1's port)",
    }
    assert {c: verdicts[c] for c in known_bugs} == {c: FAILED for c in known_bugs}
    assert verdicts["PLAN-3/inverse"] == PASSED
    # Its own domain is the first release's: dividing TP pairs, which it accepts.
    assert verdicts["PLAN-1/accepts-valid"] == PASSED
    assert verdicts["KEY-4/send-equals-recv"] == PASSED
    not_provided = {c for c, v in verdicts.items() if v == NOT_PROVIDED}
    lacking = {
        "ownership",
        "partitions",  # no pipeline parallelism in this API
        "models",  # heads over TP among them: the topology has no head count [HEAD-1]
        "agreement",
        "fp8-scales",
        "conversion",
        "fields",
        "detection",
        "paged",
        "descriptors",
        "oracle",
        "verifier",
        "record-oracle",
        "record-rows",
        "payload",
        "chunks",
        "streaming",  # sends a request whole [STREAM-1]
        "wire",
        "lifecycle",
        "tokens",
        "dp-ports",
        "state-ownership",  # no hybrid models in this API [GROUP-1]
        "state-reads",
        "group-bytes",
        "block-sizes",
        "hybrid-block-size",
        "state-oracle",
        "state-layout",
        "state-runs",
    }
    # No pipeline parallelism, attention groups or token shards in its domain; no policy
    # names; its read_layer takes no page size, so it cannot read a token pool.
    assert not_provided == {c.id for c in all_checks() if lacking & set(c.needs)} | {
        "LAYOUT-5/token-pool",
        "PLAN-4/named-policy",
        "PLAN-4/refuses-unknown-policy",
        "STAGE-2/refuses-bad-groups",
        "CP-1/refuses-unknown-rule",
        "CP-2/refuses-unfit-rule",
        "CP-3/refuses-bad-dcp",
        "DP-1/refuses-dp-rank",
        "PLAN-6/request-length",
    }
    assert INCONCLUSIVE not in verdicts.values()


def test_cli_exit_codes_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    assert main(["conform", "reference", "--clause", "PLAN", "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert report["summary"]["FAILED"] == 0 and report["summary"]["passed"] >= 5
    assert all(r["effective_examples"] >= 20 and r["obligations"] for r in report["results"])
    capsys.readouterr()
    # --json - puts the JSON on stdout and the report on stderr; --report is the old name.
    assert main(["conform", "reference", "--clause", "PLAN-3", "--json", "-", "--quiet"]) == 0
    streams = capsys.readouterr()
    assert json.loads(streams.out)["results"][0]["check"] == "PLAN-3/inverse"
    assert streams.err.splitlines()[-1].startswith("exit status 0: nothing failed")
    old = tmp_path / "old.json"
    assert (
        main(["conform", "reference", "--clause", "PLAN-3", "--report", str(old), "--quiet"]) == 0
    )
    assert json.loads(old.read_text())["summary"]["passed"] == 1
    assert "--report is deprecated" in capsys.readouterr().err
    assert "--report" not in build_parser_help()
    mutant = "kvspec.conformance.families.routing.mutants:TargetsOmitLast"
    assert main(["conform", mutant, "--clause", "PLAN-3", "--quiet"]) == 1
    text = capsys.readouterr().out
    assert "cause 1 of 1: corrupts  PLAN-3/inverse" in text and "reproduce: kvspec conform" in text
    assert main(["conform", "no_such_module:adapter"]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err
    assert main(["conform", "kvspec.topology.plan:POLICIES"]) == 2
    assert "not an instance of kvspec.conformance.Adapter" in capsys.readouterr().err


def test_parallel_runs_give_the_serial_verdicts_in_the_checks_order(capsys) -> None:
    """--jobs N: every worker loads IMPL itself; the verdicts, counterexamples and the
    order of the results are those of one process."""
    mutant = "kvspec.conformance.families.routing.mutants:TargetsOmitLast"
    clauses = ["PLAN-3", "KEY-3", "STAGE-1"]
    serial = run_suite(load_adapter(mutant), impl=mutant, patterns=clauses, profile="ci")
    parallel = run_suite(load_adapter(mutant), impl=mutant, patterns=clauses, profile="ci", jobs=2)

    def seen(report):
        return [(r.check.id, r.verdict, r.counterexample, r.tried) for r in report.results]

    assert seen(parallel) == seen(serial)
    assert any(r.verdict == FAILED for r in parallel.results)
    assert sum(r.verdict == PASSED for r in parallel.results) >= 5
    with pytest.raises(ValueError, match="jobs > 1 needs impl"):
        run_suite(load_adapter(mutant), patterns=clauses, jobs=2)
    assert main(["conform", "reference", "--jobs", "0"]) == 2
    assert "--jobs must be at least 1; got 0" in capsys.readouterr().err


def build_parser_help() -> str:
    from kvspec.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    return commands.choices["conform"].format_help()


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:0", ""])
def test_cli_refuses_an_unknown_device_before_running(device: str, capsys) -> None:
    assert main(["conform", "reference", "--device", device, "--quiet"]) == 2
    streams = capsys.readouterr()
    assert "--device must be cpu, cuda or cuda:N" in streams.err and "FAILED" not in streams.out


def test_cli_replays_a_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    example = {
        "source": {"tp": 4},
        "target": {"tp": 2},
        "model": {"num_layers": 2, "num_kv_heads": 2, "head_dim": 2},
        "policy": "lowest",
    }
    code = main(
        [
            "conform",
            "kvspec.conformance.families.routing.mutants:ReplicasMergedTwice",
            "--check",
            "PLAN-2/exact-cover",
            "--replay",
            json.dumps(example),
        ]
    )
    assert code == 1
    assert "from source ranks [0, 1]" in capsys.readouterr().out


def test_an_interrupt_inside_a_check_is_not_reported_as_the_implementations_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A timeout or Ctrl-C while Hypothesis runs propagates as itself: no example failed,
    so there is no counterexample to report (it once ended in an IndexError)."""
    from kvspec.conformance import runner

    def interrupted(*args, **kwargs):
        def run() -> None:
            raise KeyboardInterrupt

        return run

    monkeypatch.setattr(runner, "hypothesis_test", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run_check(all_checks()[0], load_adapter("reference"))


def test_loading_refuses_malformed_adapters() -> None:
    class Empty(Adapter):
        pass

    with pytest.raises(AdapterError, match="implements no capability protocol"):
        from kvspec.conformance.adapter import check_adapter

        check_adapter(Empty(), where="Empty")
    with pytest.raises(AdapterError, match="neither a built-in adapter"):
        load_adapter("nonsense")


def test_loading_says_where_an_adapter_module_broke_and_how_to_name_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "broken_at_two.py").write_text("import json\nx = json.nothere\n")
    with pytest.raises(AdapterError, match=r"has no attribute 'nothere'.* at .*broken_at_two.py:2"):
        load_adapter("broken_at_two:adapter")
    (tmp_path / "unparsable.py").write_text("x = 1\ndef f(:\n")
    with pytest.raises(AdapterError, match=r"SyntaxError: .* at .*unparsable.py:2"):
        load_adapter("unparsable:adapter")
    with pytest.raises(AdapterError, match=r"names a file; .* it: broken_at_two:adapter \("):
        load_adapter("./broken_at_two.py:adapter")
    with pytest.raises(AdapterError, match=r"names a file; .* it: pkg.mine:adapter \("):
        load_adapter("pkg/mine.py:adapter")


def test_loading_refuses_a_capability_half_written_or_misspelled() -> None:
    """An adapter that writes one method of a capability of several, or misspells one,
    is told at load time, not left with a silent 'not provided'."""
    from kvspec.conformance.adapter import check_adapter

    class TargetsAndATypo(Adapter):
        def targets(self, case, src):
            return []

        def source(self, case, dst):  # sources, misspelled
            return []

    with pytest.raises(
        AdapterError,
        match=r"overrides targets but not sources \(did you mean sources for source\?\): "
        r"the routing capability is sources \+ targets",
    ):
        check_adapter(TargetsAndATypo(), where="mine")

    class OnlyATypo(Adapter):
        def ownd(self, layout, model, rank):
            return range(0), range(0)

    with pytest.raises(
        AdapterError, match=r"implements no capability protocol \(did you mean owned for"
    ):
        check_adapter(OnlyATypo(), where="mine")


def test_loading_refuses_a_method_that_cannot_take_the_suites_arguments() -> None:
    """A wrong signature is the adapter's mistake, said at load time (exit 2), not a
    TypeError reported as the implementation's failure."""
    from kvspec.conformance.adapter import check_adapter

    class ForgotDst(Adapter, RoutingProtocol):
        def sources(self, case):
            return []

        def targets(self, case, src):
            return []

    with pytest.raises(AdapterError, match=r"ForgotDst.sources\(self, case\) cannot take"):
        check_adapter(ForgotDst(), where="mine")

    class Generous(Adapter, RoutingProtocol, LayoutsProtocol):  # extra optional, **kwargs: fine
        def sources(self, case, dst, extra=None):
            return []

        def targets(self, *args, **kwargs):
            return []

        def read_layer(self, cache, layout):  # page_size is passed only to token pools
            return ()

    check_adapter(Generous(), where="mine")


def test_a_replay_outside_the_domain_is_not_a_pass(capsys) -> None:
    """A replayed example the adapter's domain leaves out checks nothing: it says so
    instead of 'passed'; --replay without --check names what is missing."""
    from kvspec.conformance.runner import get_check, run_check

    class PipelineFree(ReferenceAdapter):
        domain = Domain(pp_sizes=(1,))

    example = TransferCase(StageLayout(2, pp=2), StageLayout(1), ModelShape(4, 2, 2)).to_dict()
    check = get_check("PLAN-3/inverse")
    result = run_check(check, PipelineFree(), replay=example)
    assert (result.verdict, result.effective) == (NOT_PROVIDED, 0)
    assert result.reason == (
        "the replayed example lies outside the adapter's declared domain: the source stage: "
        "PP2 is not among pp_sizes (1,)"
    )
    assert run_check(check, ReferenceAdapter(), replay=example).verdict == PASSED
    assert main(["conform", "reference", "--replay", "{}"]) == 2
    assert "--replay needs --check naming the one check" in capsys.readouterr().err


def test_a_run_that_checks_nothing_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ports_only.py").write_text(
        "from kvspec.conformance import Adapter\n"
        "from kvspec.conformance.adapter.protocols import PortsProtocol\n\n"
        "class PortsOnly(Adapter, PortsProtocol):\n"
        "    def kv_port(self, base, stage, rank, replica):\n"
        "        return base\n"
    )
    code = main(["conform", "ports_only:PortsOnly", "--clause", "PLAN-3", "--quiet"])
    err = capsys.readouterr().err
    assert code == 0 and "warning: nothing was checked: ports_only:PortsOnly" in err, err


def test_the_plugin_refuses_a_clause_typo_as_a_usage_error_of_its_own(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest(
        "--kvspec-impl",
        "reference",
        "--kvspec-clause",
        "PLAN-3",
        "--kvspec-clause",
        "HAED-1",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: kvspec: no check matches 'HAED-1' (of *PLAN-3*"])
    assert "cannot use reference" not in result.stderr.str()


def test_the_plugin_header_names_an_unversioned_adapter_cleanly(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        unversioned_mykv="from kvspec.conformance import Adapter\n"
        "from kvspec.conformance.adapter.protocols import PortsProtocol\n\n"
        "class PortsOnly(Adapter, PortsProtocol):\n"
        "    name = 'mykv'\n"
        "    def kv_port(self, base, stage, rank, replica):\n"
        "        return base\n"
    )
    pytester.syspathinsert()
    result = pytester.runpytest(
        "--kvspec-impl",
        "unversioned_mykv:PortsOnly",
        "--kvspec-clause",
        "PORT-1",
        "-p",
        "no:cacheprovider",
        "--co",
    )
    result.stdout.fnmatch_lines(
        ["kvspec conformance: unversioned_mykv:PortsOnly (mykv), capabilities: *"]
    )


def test_skips_file(tmp_path: Path) -> None:
    path = tmp_path / "skips.txt"
    path.write_text("# ours\nPLAN-4/* no named policy here\nNOPE-9/* stale entry\n")
    skips, unused = resolve_skips(read_skips(path), all_checks())
    plan_4 = [c.id for c in all_checks() if c.clause == "PLAN-4"]
    assert len(plan_4) > 1 and skips == dict.fromkeys(plan_4, "no named policy here")
    assert [e.pattern for e in unused] == ["NOPE-9/*"]
    path.write_text("PLAN-4/*\n")
    with pytest.raises(ValueError, match=r"skips.txt:1: 'PLAN-4/\*' needs a reason"):
        read_skips(path)


def test_skips_name_checks_as_clause_does_and_take_tabs(tmp_path: Path) -> None:
    """A skips line names checks as --clause does (a clause, a family, an obligation, a
    glob of ids), and its reason may follow a tab."""
    path = tmp_path / "skips.txt"
    path.write_text("PLAN-4\tno named policy here\nPAYLOAD-3.4:  marker merges elsewhere\n")
    skips, unused = resolve_skips(read_skips(path), all_checks())
    plan_4 = {c.id for c in all_checks() if c.clause == "PLAN-4"}
    covering = {c.id for c in all_checks() if "PAYLOAD-3.4" in c.covers}
    assert plan_4 and covering and unused == []
    assert set(skips) == plan_4 | covering
    assert {skips[i] for i in plan_4} == {"no named policy here"}


def test_a_skips_file_that_cannot_be_read_is_refused_naming_it(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nosuch.txt"
    with pytest.raises(ValueError, match=r"skips file '.*nosuch.txt' cannot be read: No such"):
        read_skips(missing)
    code = main(["conform", "reference", "--clause", "PLAN-3", "--skips", str(missing)])
    err = capsys.readouterr().err
    assert code == 2 and "nosuch.txt' cannot be read" in err and "Traceback" not in err


@pytest.mark.parametrize("kind", ["fifo", "directory", "huge", "binary"])
def test_a_skips_file_that_is_no_text_file_is_refused_unread(tmp_path: Path, kind: str) -> None:
    """A FIFO would block the read forever and a huge file fill memory: both are refused
    before a byte is read, as a directory and bytes that are not UTF-8 are."""
    path = tmp_path / "skips"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        path.write_bytes(b"PLAN-4 reason\n" * (MAX_SKIPS_BYTES // 14 + 1))
    else:
        path.write_bytes(b"PLAN-4 \xff\xfe reason\n")
    why = {"fifo": "FIFO", "directory": "directory", "huge": "over", "binary": "UTF-8"}[kind]
    with pytest.raises(ValueError, match=rf"skips file '.*skips' .*{why}"):
        read_skips(path)


def test_a_clause_pattern_that_matches_nothing_is_refused_beside_good_ones() -> None:
    """A typo never narrows a run in silence: 'HAED-1' beside 'PLAN-3' is refused."""
    with pytest.raises(
        ValueError, match=r"no check matches 'HAED-1' \(of \['PLAN-3', 'HAED-1'\]\)"
    ):
        select_checks(["PLAN-3", "HAED-1"])
    assert {c.clause for c in select_checks(["PLAN-3", "HEAD-1"])} == {"PLAN-3", "HEAD-1"}


def test_pytest_plugin(pytester: pytest.Pytester) -> None:
    pytester.syspathinsert(ROOT)
    skips = pytester.makefile(
        ".txt", skips="PLAN-4/* chosen elsewhere\nZZZ-1/* stale\nHEAD-1 not run here\n"
    )
    result = pytester.runpytest(
        "--kvspec-impl",
        "kvspec.conformance.families.routing.mutants:TargetsOmitLast",
        "--kvspec-clause",
        "PLAN",
        "--kvspec-skips",
        str(skips),
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "-rs",
    )
    result.stdout.fnmatch_lines(
        [
            "kvspec conformance: kvspec.conformance.families.routing.mutants:TargetsOmitLast*",
            "*PLAN-3/inverse failed*",
            "reproduce: kvspec conform kvspec.conformance.families.routing.mutants:TargetsOmitLast "
            "--check PLAN-3/inverse*",
            "*skip entry 'ZZZ-1/*' matches no check*",
            "*skips file: chosen elsewhere*",
        ]
    )
    assert "'HEAD-1' matches no check" not in result.stdout.str()  # a check, not run here
    outcomes = result.parseoutcomes()
    plan_4 = [c for c in all_checks() if c.clause == "PLAN-4"]
    assert outcomes["failed"] == 1 and outcomes["skipped"] == len(plan_4)
    assert outcomes["passed"] >= 4


def test_plugin_is_idle_without_an_implementation(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_mine():\n    assert True\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert "kvspec conformance" not in result.stdout.str()
    result.assert_outcomes(passed=1)


def test_plugin_items_have_file_node_ids_markers_and_honest_counts(
    pytester: pytest.Pytester,
) -> None:
    plan_checks = [c.id for c in all_checks() if c.clause.startswith("PLAN-")]
    result = pytester.runpytest(
        "--kvspec-impl",
        "reference",
        "--kvspec-clause",
        "PLAN",
        "-k",
        "PLAN-2",
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
    )
    chosen = [c for c in plan_checks if c.startswith("PLAN-2/")]
    result.stdout.fnmatch_lines(
        [f"test_kvspec_conformance.py::test_check[[]{c}[]]" for c in chosen]
        + [
            f"{len(chosen)}/{len(plan_checks)} tests collected ({len(plan_checks) - len(chosen)}"
            " deselected)*"
        ]
    )
    marked = pytester.runpytest(
        "--kvspec-impl", "reference", "-m", "kvspec_family", "--collect-only", "-q"
    )
    marked.stdout.fnmatch_lines([f"{len(all_checks())} tests collected*"])


def test_plugin_leaves_the_users_hypothesis_profile_alone(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "from hypothesis import settings\n"
        "settings.register_profile('dev', max_examples=3)\n"
        "settings.load_profile('dev')\n"
    )
    pytester.makepyfile(
        "from hypothesis import settings\n"
        "def test_users_profile_is_in_force():\n"
        "    assert settings().max_examples == 3\n"
        "    assert settings.get_current_profile_name() == 'dev'\n"
    )
    result = pytester.runpytest(
        ".",
        "--kvspec-impl",
        "reference",
        "--kvspec-clause",
        "PLAN-4",
        "--kvspec-profile",
        "ci",
        "-p",
        "no:cacheprovider",
    )
    result.stdout.fnmatch_lines(["kvspec: profile ci, *"])
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] == 1 + len([c for c in all_checks() if c.clause == "PLAN-4"])
