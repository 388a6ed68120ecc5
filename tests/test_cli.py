"""Bad input to `distlab run`: one line naming the fix, exit code 2, nothing started."""

import re

import pytest
from conftest import run_distlab

from harness import usage
from harness.commands import cli
from harness.commands import run as run_command
from harness.run import request as requests
from harness.run.state import RunResult
from labs.common.host import Cores


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "nosuchlab", "-n", "2"], "argument lab: invalid choice: 'nosuchlab' (choose from 'check', 'baseline'"),
    (["run", "check", "-n", "0"], "0 is less than 1"),
    (["run", "check", "-n", "two"], "'two' is not a whole number"),
    (["run", "check"], "the following arguments are required: --world-size"),
    (["run", "check", "-n", "2", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["run", "check", "-n", "2", "--launcher", "srun"], "invalid choice: 'srun'"),
    (["run", "check", "-n", "2", "--backend", "carrier-pigeon"], "does not use backend 'carrier-pigeon'"),
    (["run", "check", "-n", "2", "--backend", "mpi", "--launcher", "torchrun"], "launcher torchrun cannot start"),
    (["run", "check", "-n", "2", "--launcher", "python"], "plain python starts one process"),
    (["run", "baseline", "-n", "2"], "lab baseline runs on at most 1 process"),
    (["run", "check", "-n", "2", "--backend", "nccl"], "backend nccl needs 2 GPU(s)"),
    (["run", "check", "-n", "1", "--program", "/no/such/file.py"], "program /no/such/file.py does not exist"),
    (["run", "check", "-n", "1", "--timeout", "-3"], "is not positive"),
    (["run", "check", "-n", "1", "--timeout", "nan"], "'nan' is not a finite number"),
    (["run", "check", "-n", "1", "--timeout", "inf"], "'inf' is not a finite number"),
    (["run", "ddp", "-n", "2", "--launcher", "mpirun", "--max-restarts", "1"], "--max-restarts needs torchrun"),
    (["run", "ddp", "-n", "2", "--max-restarts", "-1"], "--max-restarts -1 is negative"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_starts(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(requests, "gpu_count", lambda: 0)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("distlab: error: ")
    assert message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "results").exists()


def test_missing_launcher_and_missing_libraries_name_the_fix(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(requests, "find_tool", lambda name: None if name == "horovodrun" else "/bin/" + name)
    assert cli.main(["run", "check", "-n", "2", "--backend", "horovod"]) == 2
    assert "launcher horovodrun is not installed; horovodrun comes with Horovod: run `make setup`" in \
        capsys.readouterr().err
    monkeypatch.setattr(requests, "find_tool", lambda name: "/bin/" + name)
    monkeypatch.setattr(requests, "_importable", lambda module: False)
    assert cli.main(["run", "check", "-n", "2", "--backend", "mpi"]) == 2
    assert "backend mpi needs mpi4py" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_lab_arguments_after_the_separator_are_passed_untouched():
    own, lab_args = usage.split_lab_args(["run", "ddp", "-n", "2", "--", "--epochs", "3", "--", "x"])
    assert own == ["run", "ddp", "-n", "2"]
    assert lab_args == ["--epochs", "3", "--", "x"]


def test_default_launcher_follows_the_backend_and_ranks_share_the_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(requests, "usable_cores", lambda: Cores(8, "host", 8, 8, None))
    args = cli.build_parser().parse_args(["run", "check", "-n", "2", "--backend", "mpi", "--results", str(tmp_path)])
    request = requests.from_args("check", 2, args, [])
    assert (request.launcher, request.threads) == ("mpirun", 4)  # 8 cores over 2 ranks
    monkeypatch.setattr(requests, "usable_cores", lambda: Cores(1, "cgroup cpu.max", 8, 8, 1.0))
    assert requests.from_args("check", 2, args, []).threads == 1  # never fewer than one thread a rank
    args = cli.build_parser().parse_args(["run", "check", "-n", "1", "--results", str(tmp_path)])
    assert requests.from_args("check", 1, args, []).launcher == "python"


def test_a_failure_reason_in_brackets_is_printed_as_text_not_markup(capsys, tmp_path):
    # Gloo's messages start with "[/path/pair.cc:152]", which rich would take for a closing tag.
    (tmp_path / "rank.0.log").write_text("[rank0]: RuntimeError: [/__w/gloo/pair.cc:152] timed out\n")
    reason = "RuntimeError: [/__w/gloo/pair.cc:152] timed out connecting [bold]"
    result = RunResult(tmp_path, 1, "failed", reason, None, None, 1.0)
    run_command.print_summary(result)
    out = capsys.readouterr().out
    assert reason in out and "[rank0]: RuntimeError: [/__w/gloo/pair.cc:152] timed out" in out


def test_a_smoke_run_says_it_is_too_small_to_learn_and_a_crowded_one_who_slowed_it(capsys):
    """The summary of a real smoke run of the ddp lab (the replay fixture's: loss 3.06 to 5.04, accuracy
    0.109), as `distlab run ddp -n 2 -- --smoke` prints it; then the same run with the cpu account of the
    run issue 49 met, other processes on 1.57 of the 2 cores."""
    import dataclasses

    from test_replay import FIXTURE, stored_result

    from harness.run.notes import run_notes

    result = stored_result(str(next((FIXTURE / "ddp").glob("*-ws2-torchrun"))))
    notes = run_notes("ddp", ["--smoke"], result)
    assert notes == ["a smoke run is too small to learn from (loss 3.06 to 5.04, accuracy 0.109, chance 0.1): it "
                     "shows that the ranks train together, not that the model learns. For a run that learns on a "
                     "CPU in about a minute, see labs/TRAINING.md (Accuracy on CPU); to repeat the grader's checks, "
                     "distlab grade --program ddp=yours.py"]  # others kept 0.01 of the cores busy: no word of it
    assert run_notes("ddp", [], result) == []  # the same figures from a run that is no smoke run: its own to read
    crowded = dataclasses.replace(result, cpu={**(result.cpu or {}), "others_cores": 1.57, "run_queue": 4.1})
    run_command.print_summary(crowded, run_notes("ddp", ["--smoke"], crowded))
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"ok in {result.wall_seconds:.1f} s")
    assert ("note: other processes kept 1.57 of the 2 core(s) busy while it ran (run queue 4.1): it waited for "
            "cores, so its time is longer than on free cores note: a smoke run is too small to learn from") in out


def test_version_and_launcher_spellings(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        cli.build_parser().parse_args(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("distlab ")
    for spelling in ("-n", "-np", "--nproc-per-node", "--world-size"):
        args = cli.build_parser().parse_args(["run", "check", spelling, "3", "-H", "localhost:3"])
        assert (args.world_size, args.hosts) == (3, "localhost:3")


def test_completion_knows_the_labs(capsys):
    assert cli.main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "_shtab_distlab" in script and "allreduce_bench" in script and "--world-size" in script


def test_every_command_help_has_an_example(capsys):
    """Every command `distlab --help` lists, asked for its help as a person would: an example of itself,
    and each default as it is typed (1,2,4 and 900), never as Python shows it ([1, 2, 4], 900.0, [])."""
    names = re.findall(r"^    ([a-z-]+)(?: |$)", cli.build_parser().format_help(), re.MULTILINE)
    assert {"run", "grade", "grade-class", "calibrate", "template", "scale", "bench", "completion"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit) as done:
            cli.main([name, "--help"])
        assert done.value.code == 0, name
        out = capsys.readouterr().out
        assert re.search(rf"examples:\n  distlab {name}\b", out), name
        assert not re.search(r"default:? [\[(]|default:? \d+\.0\b", out), (name, out)


def test_distlab_alone_lists_the_commands_on_stderr_and_exits_2(tmp_path):
    done = run_distlab([], cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: distlab") and "error" not in done.stderr
    assert re.findall(r"^    ([a-z-]+)(?: |$)", done.stderr, re.MULTILINE) == list(cli.COMMANDS)


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "ddpp", "-n", "2"], "argument lab: invalid choice: 'ddpp' (did you mean 'ddp'?) (choose from 'check'"),
    (["grde"], "invalid choice: 'grde' (did you mean 'grade'?)"),
    (["run", "check", "-n", "2", "--launcher", "torchrn"], "invalid choice: 'torchrn' (did you mean 'torchrun'?)"),
])
def test_a_misspelt_choice_is_one_line_naming_the_closest(argv, message, tmp_path):
    done = run_distlab(argv, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "results").exists()


def test_calibrate_refuses_a_folder_it_cannot_write_before_any_run(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    assert cli.main(["calibrate", "--profile", "mine", "--output", str(tmp_path / "a-file" / "sub")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the profile to" in err and "--output" in err and err.count("\n") == 1
    assert not (tmp_path / "results").exists()


def test_progress_in_a_log_is_one_plain_line_per_finished_run(capsys):
    from harness.console import RunProgress

    told = []
    progress = RunProgress(2, None, on_event=told.append)  # what run_progress gives when output is not a terminal
    progress.started("ddp ws=2 run 1/1")
    progress.line("epoch 1 [bold]")  # a lab's output: never printed as markup, not printed per line
    progress.ended("FAILED: [/x] boom")
    # The run, how it ended, and what is left estimated from the run measured (its wall time here).
    assert re.fullmatch(r"\[1/2\] ddp ws=2 run 1/1: FAILED: \[/x\] boom; about \d+ s left "
                        r"\(1 run\(s\) at \d+ s, the mean of the 1 done\)\n", capsys.readouterr().out)
    assert [(e["event"], e["run"], e["of"]) for e in told] == [("started", 1, 2), ("ended", 1, 2)]
    assert told[1]["outcome"] == "FAILED: [/x] boom" and told[1]["seconds"] >= 0


@pytest.mark.integration
def test_run_json_puts_the_summary_alone_on_stdout(capsys, tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "check", "-n", "1", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["status"] == "ok" and summary["metrics"]["world_size"] == 1
    assert (tmp_path / summary["run_dir"] / "run.json").is_file()
    assert "distlab run: check" in captured.err  # people's lines went to stderr
