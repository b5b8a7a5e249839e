"""The headless commands: `microgpt-gui demo`, and what it shares with `bench`
(the packaged dataset, one-line errors); bench's own: test_cli_bench.py."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import engine
from cli_support import run_in_process as run, run_main, write_lines
from engine.backends import probe_backend
from engine.cli.args import build_parser, window_parser

ROOT = Path(__file__).resolve().parents[1]


SMALL_DOCS = ["kate", "karl", "kai", "anna", "bob", "carla", "dave", "emma", "olivia", "ava", "sophia", "mia"]


def sampled_names(out: str) -> list[str]:
    """The names of demo's "sample  1: kamon" lines."""
    return [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("sample ")]


def tiny_trained_by_the_engine(data: Path, steps: int, seed: int):
    """The reference for demo's output: the engine itself (numpy, tiny) trained as demo trains."""
    preset = engine.PRESETS["tiny"].with_steps(steps)
    backend = engine.open_backend("numpy", preset.model, replace(preset.train, seed=seed),
                                  engine.Corpus.from_file(data))
    backend.train(steps)
    return backend


# demo ------------------------------------------------------------------------

def test_demo_trains_and_samples(names_path, capsys):
    code, out, err = run(["demo", "--data", str(names_path), "--steps", "30", "--samples", "4",
                          "--temperature", "0.7", "--seed", "3"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    docs = [line.strip() for line in names_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    vocab = len(set("".join(docs))) + 1
    assert f"num docs: {len(docs)}" in lines
    assert f"vocab size: {vocab}" in lines
    assert f"expected initial loss: ln({vocab}) = {math.log(vocab):.4f}" in lines
    progress = [line for line in lines if line.startswith("step ")]
    assert progress[-1].startswith("step 30 / 30 | loss ")
    assert len(progress) >= 5

    # the final loss is what the engine itself gives for the same 30 steps and seed
    preset = engine.PRESETS["tiny"].with_steps(30)
    train = replace(preset.train, seed=3)
    corpus = engine.Corpus.from_file(names_path)
    losses = engine.open_backend("numpy", preset.model, train, corpus).train(30)
    final = next(line for line in lines if line.startswith("final loss: "))
    assert final.startswith(f"final loss: {losses[-1]:.4f} (mean of the last 30 steps: {np.mean(losses):.4f}")

    samples = [line for line in lines if line.startswith("sample ")]
    assert [int(re.match(r"sample +(\d+): ", s).group(1)) for s in samples] == [1, 2, 3, 4]
    chars = set(corpus.chars)
    assert all(set(s.split(": ", 1)[1]) <= chars for s in samples)
    assert "Traceback" not in out + err


def test_demo_warmup_steps_sets_the_schedule(tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    code, out, err = run(["demo", "--data", str(data), "--steps", "12", "--samples", "1",
                          "--warmup-steps", "5"], capsys)
    assert code == 0, err
    assert "lr 0.01 (warm-up 5 steps), init_std 0.08" in out
    # the final loss is the engine's with the same warm-up, and not the one without it
    preset = engine.PRESETS["tiny"].with_steps(12)
    corpus = engine.Corpus.from_file(data)
    warm, cold = (engine.open_backend("numpy", preset.model, replace(preset.train, warmup_steps=w), corpus).train(12)
                  for w in (5, 0))
    assert f"final loss: {warm[-1]:.4f} " in out and f"{warm[-1]:.4f}" != f"{cold[-1]:.4f}"


def test_demo_reports_truncated_documents(tmp_path, capsys):
    data = write_lines(tmp_path / "long.txt", ["ab", "c" * 20, "d" * 40, "ef"])
    code, out, err = run(["demo", "--data", str(data), "--steps", "3", "--samples", "1"], capsys)
    assert code == 0, err
    assert "num docs: 4" in out
    assert "truncated: 2 documents longer than 15 characters" in out


PRESET_CHOICES = ", ".join(engine.PRESETS)


@pytest.mark.parametrize("args, message", [
    (["demo", "--steps", "0"], "--steps must be at least 1, got 0"),
    (["demo", "--steps", "ten"], "--steps must be a whole number, got 'ten'"),
    (["demo", "--samples", "-2"], "--samples must be at least 1, got -2"),
    (["demo", "--temperature", "0"], "--temperature must be a positive number, got 0"),
    (["demo", "--lr", "inf"], "--lr must be a finite number, got inf"),
    (["demo", "--lr", "10"], "--lr must be at most 1, got 10"),
    (["demo", "--lr", "0"], "--lr must be at least 1e-06, got 0"),
    (["demo", "--init-std", "1e19"], "--init-std must be at most 1, got 1e+19"),
    (["demo", "--steps", "10000000000"], "--steps must be at most 10,000,000, got 10,000,000,000"),
    (["demo", "--seed", "2147483648"], "--seed must be at most 2,147,483,647, got 2,147,483,648"),
    (["demo", "--holdout", "10000001"], "--holdout must be at most 10,000,000, got 10,000,001"),
    (["demo", "--seed", "-1"], "--seed must be at least 0, got -1"),
    (["demo", "--warmup-steps", "-1"], "--warmup-steps must be at least 0, got -1"),
    (["demo", "--warmup-steps", "2.5"], "--warmup-steps must be a whole number, got '2.5'"),
    (["demo", "--warmup-steps", "10000000000000"], "--warmup-steps must be at most 10,000,000, got 10,000,000,000,000"),
    (["demo", "--preset", "huge"], f"--preset: unknown preset 'huge'; choose from {PRESET_CHOICES}"),
    (["demo", "--steps"], "--steps: expected one argument"),
    (["demo", "--bogus"], "unrecognized arguments: --bogus"),
    (["bench", "--steps", "0"], "--steps must be at least 1, got 0"),
    (["bench", "--seconds", "-1"], "--seconds must be a non-negative number, got -1"),
    (["bench", "--sample-names", "x"], "--sample-names must be a whole number, got 'x'"),
    (["bench", "--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["bench", "--presets", "tiny,giant"], f"--presets: unknown preset 'giant'; choose from {PRESET_CHOICES}"),
    (["bench", "--backends", ","], "--backends must be a comma-separated list of names"),
])
def test_a_bad_argument_is_one_line_and_status_2(args, message, tmp_path):
    """What a person sees in a terminal: exactly one line, no usage dump, nothing on stdout."""
    result = run_main(args, tmp_path)
    assert (result.returncode, result.stderr, result.stdout) == (2, f"error: {message}\n", "")


def test_demo_checks_the_backend_before_loading_the_dataset(tmp_path):
    data = write_lines(tmp_path / "names.txt", ["anna", "bob"])
    unknown = run_main(["demo", "--backend", "nope", "--data", str(data)], tmp_path)
    assert unknown.returncode == 2 and unknown.stdout == ""  # no "num docs" first
    assert unknown.stderr.startswith("error: unknown backend 'nope'; choose from numpy, ")
    assert unknown.stderr.count("\n") == 1

    # a backend that exists but cannot run here: status 1, before the (missing) file is looked at
    if probe_backend("futhark-cuda")[0]:
        pytest.skip("futhark-cuda can run on this machine")
    cannot = run_main(["demo", "--backend", "futhark-cuda", "--data", str(tmp_path / "missing.txt")], tmp_path)
    assert cannot.returncode == 1 and cannot.stdout == ""
    assert cannot.stderr.startswith("error: backend futhark-cuda cannot run here: ")
    assert cannot.stderr.count("\n") == 1


def test_demo_samples_names_with_the_prefix(tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    code, out, err = run(["demo", "--data", str(data), "--steps", "40", "--samples", "6", "--prefix", "ka",
                          "--seed", "4"], capsys)
    assert code == 0, err
    names = sampled_names(out)
    # the engine itself, trained the same way, samples these names with that prefix
    backend = tiny_trained_by_the_engine(data, 40, seed=4)
    assert names == backend.sample(6, 0.5, 4, prefix="ka")
    assert len(names) == 6 and all(name.startswith("ka") for name in names)


@pytest.mark.parametrize("prefix, message", [
    ("kZ", "--prefix 'kZ': character 'Z' is not in the vocabulary of this dataset"),
    ("a" * 16, "--prefix must be shorter than block_size (16), got 16 characters"),
])
def test_demo_rejects_a_prefix_it_cannot_sample_before_training(prefix, message, tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    code, out, err = run(["demo", "--data", str(data), "--steps", "5", "--prefix", prefix], capsys)
    assert (code, err) == (2, f"error: {message}\n")
    assert "step " not in out


def test_demo_max_length_cuts_the_names_as_the_engine_does(tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    code, out, err = run(["demo", "--data", str(data), "--steps", "5", "--samples", "12", "--prefix", "k",
                          "--max-length", "3", "--temperature", "2", "--seed", "4"], capsys)
    assert code == 0, err
    names = sampled_names(out)
    backend = tiny_trained_by_the_engine(data, 5, seed=4)
    assert names == backend.sample(12, 2.0, 4, prefix="k", max_length=3)
    assert max(map(len, names)) == 3  # at temperature 2 some names reach the cap
    # without the flag: the longest document ("olivia", "sophia") plus 5
    code, out, err = run(["demo", "--data", str(data), "--steps", "5", "--samples", "40", "--temperature", "2",
                          "--seed", "4"], capsys)
    names = sampled_names(out)
    assert code == 0 and max(map(len, names)) == 6 + 5


@pytest.mark.parametrize("argv, message", [
    (["--max-length", "17"], "--max-length must be at most block_size (16), got 17"),
    (["--max-length", "0"], "--max-length must be at least 1, got 0"),
    (["--max-length", "ten"], "--max-length must be a whole number, got 'ten'"),
    (["--max-length", "2", "--prefix", "ka"], "--max-length must be longer than the prefix (2 characters), got 2"),
])
def test_demo_rejects_a_bad_max_length_before_training(argv, message, tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    code, out, err = run(["demo", "--data", str(data), "--steps", "5", *argv], capsys)
    assert (code, err) == (2, f"error: {message}\n")
    assert "step " not in out


@pytest.mark.parametrize("preset", list(engine.PRESETS))
def test_demo_trains_the_presets_own_steps(preset):
    """`demo --preset learn` trained 500 steps, not the preset's 4,000 (issue 27):
    without --steps a demo runs the preset's run, with --steps that many."""
    from engine.cli.checks import demo_configs

    _, train = demo_configs(build_parser().parse_args(["demo", "--preset", preset]))
    assert train == engine.PRESETS[preset].train
    _, train = demo_configs(build_parser().parse_args(["demo", "--preset", preset, "--steps", "7"]))
    assert train == engine.PRESETS[preset].with_steps(7).train


def test_demo_without_steps_runs_tinys_1000(tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    code, out, err = run(["demo", "--data", str(data), "--samples", "1"], capsys)
    assert code == 0, err
    progress = [line for line in out.splitlines() if line.startswith("step ")]
    assert progress[0].startswith("step  100 / 1000 | ") and progress[-1].startswith("step 1000 / 1000 | ")


def test_the_help_lists_learn_first_and_each_presets_steps(capsys):
    """learn, the preset for learning, came last in the list."""
    assert ", ".join(engine.PRESETS).startswith("learn, tiny, ")
    with pytest.raises(SystemExit):
        window_parser().parse_args(["--help"])
    assert f"--preset PRESET model preset to select at start ({', '.join(engine.PRESETS)})" in \
        " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"model size: {', '.join(engine.PRESETS)} (default tiny)" in text
    assert "training steps (default: the preset's; learn: 4,000; tiny, s32, s64, s128, s256, gpt2-small: 1,000)" in text


def test_demo_warns_when_the_loss_climbs_far_above_ln_v(tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    code, out, err = run(["demo", "--data", str(data), "--steps", "200", "--lr", "1", "--samples", "1"], capsys)
    # finite but far above ln(V): a warning line on stderr, the run still ends normally
    assert code == 0
    [warning] = err.splitlines()
    assert warning.startswith("warning: the run is diverging: the mean loss of the last ")
    assert "sample  1: " in out

    code, out, err = run(["demo", "--data", str(data), "--steps", "200", "--samples", "1"], capsys)
    assert (code, err) == (0, "")


def test_demo_rejects_bad_data(tmp_path, capsys):
    code, _, err = run(["demo", "--data", str(tmp_path / "missing.txt")], capsys)
    assert code == 2 and err.startswith("error: dataset file not found:")

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"anna\nj\xf6rg\n")
    code, _, err = run(["demo", "--data", str(latin1)], capsys)
    assert code == 2 and "line 2 is not valid UTF-8" in err

    empty = write_lines(tmp_path / "empty.txt", ["", "   "])
    code, _, err = run(["demo", "--data", str(empty)], capsys)
    assert code == 2 and "no documents" in err
    assert err.count("\n") == 1  # one line, no traceback


def test_demo_and_bench_use_the_packaged_names_with_no_network(no_network, capsys):
    code, out, err = run(["demo", "--steps", "2", "--samples", "2"], capsys)
    assert code == 0, err
    assert "num docs: 32033" in out and "vocab size: 27" in out and err == ""
    assert bench_rows(run, capsys, ["--presets", "tiny"]) == [("numpy", "tiny", "ok")]


def bench_rows(run, capsys, args):
    """(backend, preset, status) of each row of a short numpy bench without --data."""
    code, out, err = run(["bench", "--backends", "numpy", "--steps", "2", "--seconds", "0", "--warmup", "1",
                          "--sample-names", "0", *args], capsys)
    assert code == 0, err
    header = next(i for i, line in enumerate(out.splitlines()) if line.startswith("backend "))
    rows = [line.split() for line in out.splitlines()[header + 1:] if line.startswith("numpy ")]
    return [(r[0], r[1], "ok" if "error" not in r and "skipped:" not in r else "not ok") for r in rows]


@pytest.mark.parametrize("args, message", [
    (["--samples", "10001"], "--samples must be at most 10,000"),
    (["--steps", str(10**13)], "--steps must be at most 10,000,000"),
    (["--init-std", "1e38"], "--init-std must be at most 1, got 1e+38"),
    (["--lr", "1e4"], "--lr must be at most 1, got 10000"),
    (["--samples", "0"], "--samples must be at least 1"),
    (["--temperature", "inf"], "--temperature must be a positive number"),
])
def test_a_bad_demo_value_is_refused_before_training_by_its_flag(args, message, capsys, monkeypatch):
    from engine.backends.base import Backend

    def no_training(self, k):
        raise AssertionError("trained before refusing a bad value")

    monkeypatch.setattr(Backend, "train", no_training)
    code, out, err = run(["demo", "--steps", "3", *args], capsys)
    assert code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not re.search(r"num_samples|num_steps|init_std|learning_rate|Warning", err)
    assert "step " not in out


@pytest.mark.parametrize("std", ["1e38", "1e19"])
def test_an_overflowing_init_std_is_one_line_in_a_real_process(tmp_path, std):
    """NumPy's RuntimeWarning (with its source line) went to stderr before the error."""
    result = run_main(["demo", "--steps", "3", "--init-std", std], tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"error: --init-std must be at most 1, got {float(std):g}"]


@pytest.mark.futhark
@pytest.mark.slow
def test_demo_announces_a_first_futhark_build_and_its_time(tmp_path):
    """A new user's first futhark-c demo sat silent for 34 s while it compiled."""
    from engine.futhark import cc

    compiler = cc.find_c_compiler({"PATH": os.environ.get("PATH", "")})  # run_main passes PATH, no CC
    if compiler is None:
        pytest.skip(cc.NO_C_COMPILER)
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    args = ["demo", "--backend", "futhark-c", "--steps", "2", "--samples", "1", "--data", str(data)]
    first = run_main(args, tmp_path, timeout=600)  # a fresh HOME: an empty build cache
    assert first.returncode == 0 and first.stderr == "", first.stderr
    lines = first.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("building "))
    assert lines[at - 1].startswith("vocab size: ")
    assert re.fullmatch(rf"building futhark-c from the shipped C with {compiler.name} "
                        r"\(first use, about 20-40 s\)\.\.\.", lines[at])
    assert re.fullmatch(r"built futhark-c in \d+ s", lines[at + 1]) and lines[at + 2].startswith("model: ")
    again = run_main(args, tmp_path, timeout=600)
    assert again.returncode == 0 and "building" not in again.stdout and "built" not in again.stdout


def test_demo_reports_divergence_in_one_line(tmp_path, capsys, monkeypatch):
    """Within the limits of engine.config a run diverges rarely (lr 1: a loss in the
    thousands, but finite); a weight of inf, which makes the first step's loss NaN
    (the divergence tests of test_backend_api do the same), stands for one."""
    from engine.cli import commands

    def poisoned(*args, **kwargs):
        backend = real_open(*args, **kwargs)
        params = backend.get_params()
        params["wte"][0, 0] = np.inf
        backend.set_params(params)
        return backend

    real_open = commands.open_backend
    monkeypatch.setattr(commands, "open_backend", poisoned)
    data = write_lines(tmp_path / "names.txt", ["anna", "bob", "carla", "dave"])
    code, out, err = run(["demo", "--data", str(data), "--steps", "50"], capsys)
    assert code == 1
    assert re.fullmatch(r"error: training diverged at step \d+: the loss became (nan|-?inf)\. .*\n", err)
    assert "sample" not in out


def test_error_exit_has_no_traceback_in_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "demo", "--data",
                           str(tmp_path / "nowhere.txt")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: dataset file not found")
    assert "Traceback" not in proc.stderr
