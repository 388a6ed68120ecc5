"""Bad input to `distlab run`: one line naming the fix, exit code 2, nothing started."""

import os

import pytest

from harness import cli


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "nosuchlab", "-n", "2"], "unknown lab 'nosuchlab'; choose one of: check"),
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
    (["run", "ddp", "-n", "2", "--launcher", "mpirun", "--max-restarts", "1"], "--max-restarts needs torchrun"),
    (["run", "ddp", "-n", "2", "--max-restarts", "-1"], "--max-restarts -1 is negative"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_starts(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "gpu_count", lambda: 0)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("distlab: error: ")
    assert message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "results").exists()


def test_missing_launcher_and_missing_libraries_name_the_fix(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "find_tool", lambda name: None if name == "horovodrun" else "/bin/" + name)
    assert cli.main(["run", "check", "-n", "2", "--backend", "horovod"]) == 2
    assert "launcher horovodrun is not installed; horovodrun comes with Horovod: run `make setup`" in \
        capsys.readouterr().err
    monkeypatch.setattr(cli, "find_tool", lambda name: "/bin/" + name)
    monkeypatch.setattr(cli, "_importable", lambda module: False)
    assert cli.main(["run", "check", "-n", "2", "--backend", "mpi"]) == 2
    assert "backend mpi needs mpi4py" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_lab_arguments_after_the_separator_are_passed_untouched():
    own, lab_args = cli.split_lab_args(["run", "ddp", "-n", "2", "--", "--epochs", "3", "--", "x"])
    assert own == ["run", "ddp", "-n", "2"]
    assert lab_args == ["--epochs", "3", "--", "x"]


def test_default_launcher_follows_the_backend(tmp_path):
    args = cli.build_parser().parse_args(["run", "check", "-n", "2", "--backend", "mpi", "--results", str(tmp_path)])
    request = cli.resolve_request("check", 2, args, [])
    assert (request.launcher, request.threads) == ("mpirun", max(1, (os.cpu_count() or 1) // 2))
    args = cli.build_parser().parse_args(["run", "check", "-n", "1", "--results", str(tmp_path)])
    assert cli.resolve_request("check", 1, args, []).launcher == "python"


def test_a_failure_reason_in_brackets_is_printed_as_text_not_markup(capsys, tmp_path):
    # Gloo's messages start with "[/path/pair.cc:152]", which rich would take for a closing tag.
    (tmp_path / "rank.0.log").write_text("[rank0]: RuntimeError: [/__w/gloo/pair.cc:152] timed out\n")
    reason = "RuntimeError: [/__w/gloo/pair.cc:152] timed out connecting [bold]"
    result = cli.RunResult(tmp_path, 1, "failed", reason, None, None, 1.0)
    cli.print_summary(result)
    out = capsys.readouterr().out
    assert reason in out and "[rank0]: RuntimeError: [/__w/gloo/pair.cc:152] timed out" in out
