"""`loomrt bench` through typer's CliRunner: the table, --json, --out files, --docs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loomrt.bench.report import BEGIN, END
from loomrt.cli.bench_cmd import bench_app

runner = CliRunner()
QUICK = ["run", "chat200", "--quick", "--embedder", "hash", "--modes", "recap,compaction"]


@pytest.mark.slow
def test_json_out_and_docs(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nIntro stays.\n\n{BEGIN}\nold figures\n{END}\n\nOutro stays.\n", encoding="utf-8")
    out = tmp_path / "bench"
    result = runner.invoke(bench_app, [*QUICK, "--json", "--out", str(out), "--docs", str(doc)])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    modes = figures["workloads"]["chat200"]["modes"]
    assert list(modes) == ["append", "recap", "compaction"]
    assert modes["compaction"]["ratio"] < 1
    for name in ("report.md", "results.json", "tokens.png", "fidelity.png"):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "results.json").read_text())["workloads"]["chat200"]["modes"] == modes
    report = (out / "report.md").read_text()
    assert "| compaction | compaction |" in report and "loomrt bench run chat200" in report
    text = doc.read_text()
    assert "old figures" not in text and "Intro stays." in text and "Outro stays." in text
    assert "--modes recap,compaction" in text and "bench/tokens.png" in text
    assert text.count(BEGIN) == 1 and text.count(END) == 1


@pytest.mark.slow
def test_table_in_the_terminal() -> None:
    result = runner.invoke(bench_app, QUICK)
    assert result.exit_code == 0, result.output
    assert "chat200" in result.stdout and "compaction" in result.stdout and "×app" in result.stdout


@pytest.mark.slow
def test_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    result = runner.invoke(bench_app, ["run", "nope", "--quick"])
    assert result.exit_code == 2 and "unknown workload or measure nope" in result.output
    result = runner.invoke(bench_app, ["run", "chat200", "--modes", "fold9"])
    assert result.exit_code == 2 and "unknown mode fold9" in result.output
    doc = tmp_path / "no-markers.md"
    doc.write_text("# nothing to replace\n")
    result = runner.invoke(bench_app, [*QUICK, "--docs", str(doc)])
    assert result.exit_code != 0


def test_list_names_every_workload_and_measure() -> None:
    result = runner.invoke(bench_app, ["list"])
    assert result.exit_code == 0
    for name in ("chat200", "agentic", "locomo", "overhead", "recall_latency"):
        assert name in result.stdout


@pytest.mark.slow
def test_model_option_plays_a_given_model(tmp_path: Path) -> None:
    """--model swaps the scripted bench model for any model string; a scripted file here."""
    import yaml

    script = tmp_path / "model.yaml"
    turns = [{"text": f"Reply {i}: " + "fine words " * 120} for i in range(60)]
    script.write_text(
        yaml.safe_dump(
            {"turns": turns, "summaries": ["Summary: the reply was fine words. " + "Reply fine words. " * 40]}
        )
    )
    result = runner.invoke(
        bench_app,
        [
            "run",
            "chat200",
            "--quick",
            "--embedder",
            "hash",
            "--modes",
            "compaction",
            "--model",
            f"scripted/{script}",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    modes = json.loads(result.stdout.strip().splitlines()[-1])["workloads"]["chat200"]["modes"]
    assert modes["append"]["model_calls"] == 60 and modes["append"]["answered"] == 0.0  # it never knows the facts
    assert modes["compaction"]["distillations"] >= 1 and modes["compaction"]["ratio"] < 1


def test_harvest_resume_needs_a_readable_out_file(tmp_path: Path) -> None:
    """``bench harvest --resume`` says what is wrong before measuring anything."""
    import loomrt.cli.bench_harvest_cmd  # noqa: F401  (registers the command)

    result = runner.invoke(bench_app, ["harvest", "--no-model", "--resume"])
    assert result.exit_code == 2 and "--resume needs --out FILE" in result.output
    bad = tmp_path / "harvest.json"
    bad.write_text('{"coreference": []')
    result = runner.invoke(bench_app, ["harvest", "--no-model", "--resume", "--out", str(bad)])
    said = " ".join(result.output.split())  # the console wraps at its width, wherever the path ends
    assert result.exit_code == 2 and "cannot resume from it" in said and str(bad) in said
    assert bad.read_text() == '{"coreference": []'  # left as it was
