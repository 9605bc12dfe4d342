"""neuron-batch against the real daemon: every record answered once, in order, with its key;
corrupt records under fail and skip; npz outputs; resume after SIGKILL giving exactly the
full output; usage errors."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from interrupts import as_from_a_terminal
from terminal import on_a_terminal
from waiting import wait_until

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import NrtClientError
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.proto import tf_pb
from neuron_rtd.records.features import parse_feature
from neuron_rtd.records.tfrecord import Writer, build_index, read_file
from neuron_rtd.tools.stream.copies import _Copies, _Stopped
from neuron_rtd.tools.stream.figures import Totals
from neuron_rtd.tools.stream.pipeline import Options, Pipeline
from neuron_rtd.tools.stream.sample import local_s3

pytestmark = pytest.mark.daemon

BATCH = 4
FEATURE = "x:float32:16"


@pytest.fixture(scope="module")
def model(module_work: Path) -> tuple[SampleModel, Path]:
    sample = build_mlp((16, 32, 8), batch=BATCH, seed=9)
    path = module_work / "mlp.neff"
    path.write_bytes(sample.neff)
    return sample, path


def make_shards(folder: Path, shards: int, per_shard: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Shards of Examples with a raw float32 feature `x` of 16; each record's x by key."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    xs: dict[str, np.ndarray] = {}
    for s in range(shards):
        path = folder / f"part-{s:02d}.tfrecord"
        with Writer(path) as writer:
            for _ in range(per_shard):
                x = rng.standard_normal(16).astype(np.float32)
                example = tf_pb.Example()
                example.features.feature["x"].bytes_list.value.append(x.tobytes())
                writer.write(example.SerializeToString())
        for (offset, _), _record in zip(build_index(path), range(per_shard), strict=True):
            xs[f"{path}@{offset}"] = rng_x(path, offset)
    return xs


def rng_x(path: Path, offset: int) -> np.ndarray:
    for record in read_file(path, start=offset):
        example = tf_pb.Example.FromString(record.data)
        return np.frombuffer(example.features.feature["x"].bytes_list.value[0], np.float32)
    raise AssertionError("no record there")


def batch_cmd(daemon: DaemonProcess, neff: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "neuron_rtd.cli.neuron_batch",
        "--neff",
        str(neff),
        "--feature",
        FEATURE,
        "-a",
        daemon.address,
        *args,
    ]


def outputs_of(folder: Path) -> dict[str, np.ndarray]:
    """Every output record's probs by its input key; a key seen twice fails."""
    found: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("*.tfrecord")):
        for record in read_file(path):
            features = tf_pb.Example.FromString(record.data).features.feature
            key = features["key"].bytes_list.value[0].decode()
            assert key not in found, f"{key} written twice"
            found[key] = np.array(features["probs"].float_list.value, np.float32)
    return found


def test_every_record_is_answered_in_order_with_its_key(
    daemon: DaemonProcess, model: tuple[SampleModel, Path], work: Path
) -> None:
    sample, neff = model
    xs = make_shards(work / "in", shards=3, per_shard=10)  # 10: the last batch is padded
    out = work / "out"
    done = subprocess.run(
        batch_cmd(
            daemon,
            neff,
            "--input",
            str(work / "in" / "*.tfrecord"),
            "--output",
            str(out),
            "--ncgs",
            "2",
            "--json",
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    final = json.loads(done.stdout.splitlines()[-1])
    assert (final["records"], final["units_done"], final["skipped"]) == (30, 3, 0)
    # the host's busy CPU time over the streaming alone: at most all its cores (a tick more)
    assert 0 <= final["host_cpu_s"] <= final["seconds"] * final["host_cpus"] + 0.02
    assert 0 < final["nc_busy_share"] <= 1  # the daemon's busy time of the run's NCs
    # and its CPU time, over a window inside the streaming's
    assert 0 < final["daemon_cpu_s"] <= final["seconds"] * final["host_cpus"] + 0.02
    got = outputs_of(out)
    assert set(got) == set(xs)
    for key, probs in got.items():  # each answer is the model's on that record's x
        want = sample.reference({"x": np.tile(xs[key], (BATCH, 1))})["probs"][0]
        np.testing.assert_allclose(probs, want, rtol=1e-4, atol=1e-6)
    for path in out.glob("*.tfrecord"):  # in the order of the shard's records
        offsets = [int(k.rsplit("@", 1)[1]) for k in outputs_of_file(path)]
        assert offsets == sorted(offsets)
    assert not list(out.glob(".*.partial"))


def outputs_of_file(path: Path) -> list[str]:
    return [
        tf_pb.Example.FromString(r.data).features.feature["key"].bytes_list.value[0].decode()
        for r in read_file(path)
    ]


def test_corrupt_records_fail_or_are_skipped_and_npz_outputs(
    daemon: DaemonProcess, model: tuple[SampleModel, Path], work: Path
) -> None:
    _, neff = model
    make_shards(work / "in", shards=2, per_shard=8)
    victim = work / "in" / "part-01.tfrecord"
    data = bytearray(victim.read_bytes())
    data[build_index(victim)[3][0] + 20] ^= 0xFF  # inside the 4th record's data
    victim.write_bytes(data)
    args = ["--input", str(work / "in" / "*.tfrecord"), "--format", "npy", "--decode-workers", "1"]
    failed = subprocess.run(
        batch_cmd(daemon, neff, *args, "--output", str(work / "fail")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert failed.returncode == 1
    assert (
        f"{victim}: corrupt record at offset {build_index_clean_offset(work, 3)}" in failed.stderr
    )
    assert "Traceback" not in failed.stderr
    skipped = subprocess.run(
        batch_cmd(
            daemon, neff, *args, "--output", str(work / "skip"), "--on-corrupt", "skip", "--json"
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert skipped.returncode == 0, skipped.stderr
    final = json.loads(skipped.stdout.splitlines()[-1])
    assert (final["records"], final["skipped"]) == (15, 1)
    keys: Counter[str] = Counter()
    for path in (work / "skip").glob("*.npz"):
        with np.load(path) as npz:
            assert npz["probs"].shape == (len(npz["keys"]), 8)
            keys.update(str(k) for k in npz["keys"])
    assert sum(keys.values()) == 15 and max(keys.values()) == 1


def build_index_clean_offset(work: Path, index: int) -> int:
    return build_index(work / "in" / "part-00.tfrecord")[index][0]  # same layout: same sizes


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_a_killed_run_resumes_to_exactly_the_full_output(
    daemon: DaemonProcess, model: tuple[SampleModel, Path], work: Path, stop: signal.Signals
) -> None:
    """Killed at any point, or stopped by Ctrl-C or SIGTERM (which leave no partial
    output and say how to go on), a run resumed gives exactly the full output."""
    _, neff = model
    xs = make_shards(work / "in", shards=8, per_shard=12, seed=3)
    out = work / "out"
    args = ["--input", str(work / "in" / "*.tfrecord"), "--output", str(out), "--channels", "1"]
    inject = Path(daemon.sim_root) / "neuron0" / "inject"
    inject.write_text("nc_delay_ms=40\n")  # slow enough to be killed mid-run
    try:
        run = subprocess.Popen(
            as_from_a_terminal(batch_cmd(daemon, neff, *args)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        checkpoint = out / ".checkpoint.json"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None:
            if checkpoint.exists() and len(json.loads(checkpoint.read_text())["done"]) >= 2:
                break
            time.sleep(0.05)
        ended = run.poll()  # None: still running, as it must be to be stopped mid-run
        if ended is None:
            os.kill(run.pid, stop)
        _, err = run.communicate(timeout=60)
        assert ended is None and checkpoint.exists(), (
            (f"neuron-batch ended by itself, exit {ended}" if ended is not None else "")
            + ("; no unit done in 120 s" if not checkpoint.exists() else "")
            + f"\n{err.decode(errors='replace')[-3000:]}\ndaemon log:\n{daemon.log()[-3000:]}"
        )
        if stop != signal.SIGKILL:
            assert run.returncode == 128 + stop, err
            assert f"stopped by {stop.name}".encode() in err and b"--resume" in err, err
            assert b"Traceback" not in err
            assert not list(out.glob(".*.partial"))
        done_before = len(json.loads(checkpoint.read_text())["done"])
        assert 2 <= done_before < 8, done_before
    finally:
        inject.write_text("nc_delay_ms=0\n")
    resumed = subprocess.run(
        batch_cmd(daemon, neff, *args, "--resume", "--json"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads(resumed.stdout.splitlines()[-1])
    assert final["units_skipped"] == done_before and final["units_done"] == 8 - done_before
    assert set(outputs_of(out)) == set(xs)  # none missing, none twice (outputs_of checks)
    assert not list(out.glob(".*.partial"))


def test_a_daemon_gone_mid_run_fails_it_once_and_a_resume_completes_it(
    model: tuple[SampleModel, Path], work: Path
) -> None:
    """The daemon SIGKILLed under a run: exit 1 saying no runtime answers, no traceback;
    resumed against a new daemon, the output is exactly the full one."""
    _, neff = model
    xs = make_shards(work / "in", shards=6, per_shard=12, seed=5)
    out = work / "out"
    args = ["--input", str(work / "in" / "*.tfrecord"), "--output", str(out), "--channels", "2"]
    with DaemonProcess(sim_root=work / "sim") as doomed:
        (work / "sim" / "neuron0" / "inject").write_text("nc_delay_ms=40\n")
        run = subprocess.Popen(
            batch_cmd(doomed, neff, *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        checkpoint = out / ".checkpoint.json"
        wait_until(checkpoint.exists, 120, "neuron-batch's first checkpoint")
        assert doomed.proc is not None
        doomed.proc.kill()
        _, err = run.communicate(timeout=60)
    assert run.returncode == 1, err
    assert b"the daemon: infer: NERR_FAIL: no runtime answers" in err, err
    assert b"Traceback" not in err
    with DaemonProcess(sim_root=work / "sim2") as again:
        resumed = subprocess.run(
            batch_cmd(again, neff, *args, "--resume"), capture_output=True, text=True, timeout=300
        )
    assert resumed.returncode == 0, resumed.stderr
    assert set(outputs_of(out)) == set(xs)  # none missing, none twice (outputs_of checks)


def test_no_batch_is_sent_after_one_failed() -> None:
    """The first failed inference is the run's failure at once, and stops the sending:
    with the daemon gone, the batches after it would each wait to reconnect."""

    class Copy:
        def __init__(self) -> None:
            self.sent: list[Future[dict[str, np.ndarray]]] = []

        def infer_async(
            self, inputs: dict[str, np.ndarray], posted: bool, cast: bool = False
        ) -> Future[dict[str, np.ndarray]]:
            self.sent.append(Future())
            return self.sent[-1]

    failures: list[BaseException] = []
    one, two = Copy(), Copy()
    copies = _Copies([one, two], 2, failures.append, stage=False)  # type: ignore[list-item]

    def send() -> Future[dict[str, np.ndarray]]:
        index, staged = copies.stage()
        assert staged is None  # not staged: the batch comes in arrays of its own
        return copies.send(index, {})

    batches = [send() for _ in range(3)]
    assert [len(one.sent), len(two.sent)] == [2, 1]  # the least busy copy each time
    index, _ = copies.stage()
    assert index == 1
    copies.unstage(index, None)  # given back unsent: still the least busy
    assert copies.stage()[0] == 1
    batches[0].set_result({})
    gone = NrtClientError(Nerr.FAIL, "no runtime answers", "infer")
    batches[1].set_exception(gone)
    assert failures == [gone]
    with pytest.raises(_Stopped):
        copies.send(1, {})  # the one staged before the failure is not sent
    with pytest.raises(_Stopped):
        copies.stage()
    assert len(one.sent) + len(two.sent) == 3


def test_usage_errors_exit_2(
    daemon: DaemonProcess, model: tuple[SampleModel, Path], work: Path
) -> None:
    _, neff = model
    (work / "junk.neff").write_bytes(b"not a model")
    (work / "a-file").write_text("")
    make_shards(work / "data", shards=1, per_shard=2)
    data = ["--input", str(work / "data" / "*.tfrecord")]
    cases: list[tuple[list[str], str, dict[str, str] | None]] = [
        (batch_cmd(daemon, neff, *args), why, None)
        for args, why in (
            (["--input", str(work / "none-*"), "--output", str(work / "o")], "no file there"),
            (["--input", "x", "--output", "o", "--feature", "x:float32"], "expected NAME:DTYPE"),
            (["--input", "x", "--output", "o", "--ncgs", "0"], "a whole number of 1 or more"),
            (["--output", "o"], "give --input (one or more) or --manifest"),
            (["--manifest", str(work / "none.json"), "--output", "o"], "No such file"),
            # what the model takes is checked before the daemon is asked or a record read
            ([*data, "--output", "o", "--feature", "y:float32:3"], "the model has no input 'y'"),
            ([*data, "--output", "o", "--feature", "y=x:float32:16"], "'x' is fed already"),
            ([*data, "--output", "o", "--batch", "3"], "the model takes batches of 4"),
            ([*data, "--output", str(work / "a-file")], "cannot make the folder (a file is there)"),
            ([*data, "--output", "o", "--neff", str(work / "junk.neff")], "not a NEFF"),
        )
    ]
    # a record's shape that is not the model's
    command = batch_cmd(daemon, neff, *data, "--output", "o")
    command[command.index(FEATURE)] = "x:float32:4,4"
    cases.append((command, "'x' is float32 (4, 16), so a record is 16, not 4,4", None))
    # a store that does not answer: said, not taken for an empty one
    unreachable = {
        **os.environ,
        "FSSPEC_S3_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
    }
    command = batch_cmd(daemon, neff, "--input", "s3://b/x.tfrecord", "--output", "o")
    cases.append((command, "--input s3://b/x.tfrecord: EndpointConnectionError", unreachable))
    runs = [  # all at once: each is a second of Python's start
        subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
        for command, _, env in cases
    ]
    for run, (_, why, _) in zip(runs, cases, strict=True):
        _, err = run.communicate(timeout=120)
        assert run.returncode == 2 and why in err, err
        assert "Traceback" not in err


@pytest.fixture
def s3(work: Path) -> Iterator[dict[str, str]]:
    if (
        shutil.which("moto_server") is None
        and not (Path(sys.executable).parent / "moto_server").exists()
    ):
        pytest.skip("moto's server is not installed")
    with local_s3(work) as env:
        yield env


def test_shards_streamed_from_s3(
    daemon: DaemonProcess, model: tuple[SampleModel, Path], work: Path, s3: dict[str, str]
) -> None:
    _, neff = model
    xs = make_shards(work / "in", shards=2, per_shard=9, seed=5)
    env = {**os.environ, **s3}
    upload = (
        "import sys, fsspec, gzip, pathlib\n"
        "fs = fsspec.filesystem('s3'); fs.mkdir('data')\n"
        "for p in map(pathlib.Path, sys.argv[1:]):\n"
        "    fs.pipe('data/' + p.name + '.gz', gzip.compress(p.read_bytes()))\n"
    )
    shards = sorted(str(p) for p in (work / "in").glob("*.tfrecord"))
    subprocess.run([sys.executable, "-c", upload, *shards], env=env, check=True, timeout=120)
    done = subprocess.run(
        batch_cmd(
            daemon,
            neff,
            "--input",
            "s3://data/part-*.tfrecord.gz",
            "--output",
            str(work / "out"),
            "--json",
        ),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = outputs_of(work / "out")
    assert len(got) == 18
    # the keys name the s3 objects; offsets are those of the uncompressed stream
    local = {k.rsplit("/", 1)[1] for k in xs}
    assert {k.rsplit("/", 1)[1].replace(".tfrecord.gz@", ".tfrecord@") for k in got} == local


def test_the_readme_stream_demo_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.cli.stream_demo", "--images", "32"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "neuron-batch: 32 records in" in done.stdout and "0 skipped; 8 shard(s)" in done.stdout
    assert "first output: images-" in done.stdout
    # the command it prints names paths it removes: it says so
    assert "(its files are in a temporary folder, removed when the demo ends: --work DIR " in (
        done.stdout
    )


def test_the_stream_demo_keeps_its_files_in_work_and_runs_again_there(work: Path) -> None:
    kept = work / "kept"
    demo = [sys.executable, "-m", "neuron_rtd.cli.stream_demo", "--images", "8"]
    demo += ["--work", str(kept)]
    for _ in range(2):  # the second run starts over in the folder the first one used
        done = subprocess.run(demo, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"(its files stay in {kept}; the daemon it names stops" in done.stdout
        assert sorted(p.name for p in kept.iterdir()) == ["data", "out", "resnet.neff", "sim"]
        assert len(list((kept / "out").glob("*.tfrecord"))) == 8
    assert "--overwrite" in done.stdout


def test_a_used_output_folder_is_refused_unless_resume_or_overwrite(
    daemon: DaemonProcess, model: tuple[SampleModel, Path], work: Path
) -> None:
    """A run into a folder another run used would leave that run's outputs beside a
    checkpoint of its own: it is refused, or told what to do."""
    _, neff = model
    xs = make_shards(work / "in", shards=3, per_shard=4)
    out = work / "out"
    everything = batch_cmd(daemon, neff, "--input", str(work / "in" / "*.tfrecord"))
    first = subprocess.run([*everything, "--output", str(out)], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    one = batch_cmd(daemon, neff, "--input", str(work / "in" / "part-00.tfrecord"))
    again = subprocess.run([*one, "--output", str(out)], capture_output=True, text=True)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr == (
        f"neuron-batch: error: --output {out}: a run used it already (its checkpoint "
        f"{out}/.checkpoint.json: 3 shard(s) done): give --resume to go on with that run, "
        "--overwrite to start over in it, or another folder\n"
    )
    assert set(outputs_of(out)) == set(xs)  # nothing touched
    over = subprocess.run(
        [*one, "--output", str(out), "--overwrite", "--json"], capture_output=True, text=True
    )
    assert over.returncode == 0, over.stderr
    assert json.loads(over.stdout.splitlines()[-1])["units_done"] == 1
    assert {key.split("@")[0] for key in outputs_of(out)} == {str(work / "in" / "part-00.tfrecord")}


def test_a_manifest_interleaves_by_weight_and_a_resume_replays_its_weights(
    daemon: DaemonProcess, model: tuple[SampleModel, Path], work: Path
) -> None:
    _, neff = model
    make_shards(work / "cats", shards=2, per_shard=40, seed=7)
    make_shards(work / "dogs", shards=2, per_shard=40, seed=8)
    manifest = work / "m.json"

    def weigh(cats: float, dogs: float) -> None:
        classes = {
            "cats": {"weight": cats, "shards": [str(work / "cats" / "*.tfrecord")]},
            "dogs": {"weight": dogs, "shards": [str(work / "dogs" / "*.tfrecord")]},
        }
        manifest.write_text(json.dumps({"classes": classes}))

    weigh(3, 1)
    out = work / "out"
    options = Options(
        neff=str(neff), shards=[], features=[parse_feature(FEATURE)], output=out,
        address=daemon.address, manifest=manifest, chunk_records=32, shuffle=5,
    )  # fmt: skip
    totals = Pipeline(options, lambda figures: None).run()
    assert (totals.records, totals.units_done) == (160, 5)
    chunks = sorted(out.glob("e000-mix-*.tfrecord"))
    first = outputs_of_file(chunks[0])
    cats = sum("/cats/" in key for key in first)
    assert 18 <= cats <= 30, cats  # 3:1 of 32 is 24 (binomial sd 2.4)
    everything = [key for chunk in chunks for key in outputs_of_file(chunk)]
    assert len(everything) == len(set(everything)) == 160  # each record once
    # lose a middle chunk, change the weights, resume: the chunk comes back the same
    lost = chunks[2]
    before = outputs_of_file(lost)
    lost.unlink()
    saved = json.loads((out / ".checkpoint.json").read_text())
    saved["done"].remove(lost.name.removesuffix(".tfrecord"))
    (out / ".checkpoint.json").write_text(json.dumps(saved))
    weigh(1, 50)
    resumed = Pipeline(dataclasses.replace(options, resume=True), lambda f: None).run()
    assert (resumed.units_done, resumed.units_skipped) == (1, 4)
    assert outputs_of_file(lost) == before


def test_progress_on_a_terminal(tmp_path: Path) -> None:
    """Under a terminal (script(1) gives one), rich shows records/s and the waits; the
    summary follows."""
    typescript = tmp_path / "typescript"
    command = f"{sys.executable} -m neuron_rtd.cli.stream_demo --images 2048"
    screen = on_a_terminal(command, typescript)
    assert " records  " in screen and "/s  " in screen and "MB/s" in screen
    assert "neuron-batch: 2048 records in" in screen and "Traceback" not in screen


def test_the_docs_name_every_key_of_the_json_lines() -> None:
    """Scripts read `--json`'s lines by docs/streaming.md's table of keys: it lists them all."""
    import re

    page = (Path(__file__).parents[3] / "docs" / "streaming.md").read_text()
    table = page[page.index("| key | what |") :].split("\n\n")[0]
    rows = [row.strip().split("|")[1] for row in table.splitlines()[2:]]
    documented = {key for row in rows for key in re.findall(r"`(\w+)`", row)}
    assert documented == set(Totals().snapshot())
