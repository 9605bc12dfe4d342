"""neuron-batch against a hostile local user (issue 22): an output folder of another user's,
or one others may write in, refused; temporaries no planted link can redirect; checkpoints
that cannot be resumed from refused clearly, and a unit whose output is gone done again;
records over the size limit refused unread; shards over http(s), and no credentials of a
URL in anything said or written."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import logging
import os
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_neuron_batch import BATCH, FEATURE, make_shards, outputs_of

from neuron_rtd.cli import neuron_batch
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.records.tfrecord import Writer, build_index
from neuron_rtd.tools.stream import output_folder
from neuron_rtd.tools.stream.checkpoint import Checkpoint
from neuron_rtd.tools.stream.output_folder import Temporary, UnsafeOutput, prepare
from neuron_rtd.tools.stream.sources import Shard, expand, redact
from neuron_rtd.tools.stream.units import WorkUnit

USER, PASSWORD = "reader", "pw-Xq7s3cr3t"  # the http server's Basic auth
NOBODY = 65534


@pytest.fixture(scope="module")
def neff(module_work: Path) -> Path:
    path = module_work / "mlp.neff"
    path.write_bytes(build_mlp((16, 32, 8), batch=BATCH, seed=9).neff)
    return path


def run(capsys: pytest.CaptureFixture[str], neff: Path, *args: str) -> tuple[int, str, str]:
    """neuron-batch in this process: its exit code, stdout and stderr."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = neuron_batch.main(["--neff", str(neff), "--feature", FEATURE, *args])
    finally:
        signal.signal(signal.SIGTERM, previous)
    out, err = capsys.readouterr()
    return code, out, err


def refused(code: int, err: str) -> str:
    """The one line of a usage error (exit 2)."""
    assert code == 2 and err.count("\n") == 1 and err.startswith("neuron-batch: error: "), err
    return err


# --- the output folder ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "writers"),
    [
        (0o777, "group and others"),
        (0o775, "group"),
        (0o757, "others"),
        (0o1777, "group and others"),
    ],
)
def test_an_output_folder_others_may_write_in_is_refused(
    capsys: pytest.CaptureFixture[str], neff: Path, work: Path, mode: int, writers: str
) -> None:
    make_shards(work / "in", shards=1, per_shard=2)
    out = work / "out"
    out.mkdir()
    out.chmod(mode)
    code, _, err = run(capsys, neff, "--input", str(work / "in" / "*"), "--output", str(out))
    assert f"--output {out}: writable by its {writers} (mode {mode:04o})" in refused(code, err)
    assert "chmod go-w it, or give another folder" in err
    assert not list(out.iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_an_output_folder_of_another_user_is_refused(
    capsys: pytest.CaptureFixture[str], neff: Path, work: Path
) -> None:
    """Root included: a folder `nobody` made (0755, not writable by others) is still theirs."""
    make_shards(work / "in", shards=1, per_shard=2)
    out = work / "out"
    out.mkdir(mode=0o755)
    os.chown(out, NOBODY, NOBODY)
    code, _, err = run(capsys, neff, "--input", str(work / "in" / "*"), "--output", str(out))
    assert f"--output {out}: owned by uid {NOBODY}" in refused(code, err)
    assert (
        f"not by the user running (uid {os.geteuid()}" in err and "give a folder of your own" in err
    )
    with pytest.raises(UnsafeOutput, match="owned by uid 65534"):  # the API refuses it too
        prepare(out)


@pytest.mark.parametrize(("umask", "mode"), [(0o000, 0o755), (0o022, 0o755), (0o077, 0o700)])
def test_a_missing_output_folder_is_made_0755_at_most(work: Path, umask: int, mode: int) -> None:
    previous = os.umask(umask)
    try:
        prepare(work / "a" / "out")
    finally:
        os.umask(previous)
    for made in (work / "a", work / "a" / "out"):  # its parents made too, as narrow
        assert stat.S_IMODE(made.stat().st_mode) == mode
    prepare(work / "a" / "out")  # there, and the run's own: taken


# --- temporaries ------------------------------------------------------------------------


def test_a_temporary_never_opens_a_planted_name(
    monkeypatch: pytest.MonkeyPatch, work: Path
) -> None:
    """A link planted at the very name a temporary draws is never written through (another
    name is drawn), and its rename replaces a link at the final name, not the link's target."""
    victims = [work / "victim-1", work / "victim-2"]
    for victim in victims:
        victim.write_text("precious")
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(output_folder.secrets, "token_hex", lambda _: next(names))
    (work / ".out.tfrecord.planted.partial").symlink_to(victims[0])
    (work / "out.tfrecord").symlink_to(victims[1])
    temporary = Temporary(work, "out.tfrecord")
    assert temporary.path == work / ".out.tfrecord.fresh.partial"
    temporary.file.write(b"output")
    temporary.commit()
    assert [v.read_text() for v in victims] == ["precious", "precious"]
    assert not (work / "out.tfrecord").is_symlink()
    assert (work / "out.tfrecord").read_bytes() == b"output"


@pytest.mark.daemon
def test_a_run_never_writes_through_links_planted_at_its_names(
    capsys: pytest.CaptureFixture[str], daemon: DaemonProcess, neff: Path, work: Path
) -> None:
    """Links at the names a run writes (the former predictable temporaries, the checkpoint,
    the outputs) point at files outside: the run replaces or removes the links, and the
    files they point at are untouched."""
    xs = make_shards(work / "in", shards=2, per_shard=5)
    out = work / "out"
    out.mkdir(mode=0o700)
    victim = work / "victim"
    victim.write_text("precious")
    units = [WorkUnit(0, shard).name for shard in expand([str(work / "in" / "*")])]
    planted = [".checkpoint.tmp", ".checkpoint.json"]
    planted += [f".{u}.tfrecord.partial" for u in units] + [f"{u}.tfrecord" for u in units]
    for name in planted:
        (out / name).symlink_to(victim)
    args = ["--input", str(work / "in" / "*"), "--output", str(out), "-a", daemon.address]
    code, _, err = run(capsys, neff, *args)  # a checkpoint there: a run used the folder
    assert code == 2 and "a run used it already" in err, err
    code, _, err = run(capsys, neff, *args, "--overwrite")  # the link goes, not its file
    assert code == 0, err
    assert victim.read_text() == "precious"
    assert set(outputs_of(out)) == set(xs)
    assert not [p.name for p in out.iterdir() if p.is_symlink() and p.name != ".checkpoint.tmp"]
    assert not list(out.glob(".*.partial"))


# --- checkpoints ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"done":5}', 'expected {"done": [UNIT, ...], "weights": {...}}'),
        (b"not json", "not JSON: Expecting value: line 1 column 1 (char 0)"),
        (b'{"nodone":1}', 'expected {"done": [UNIT, ...]'),
        (b"[1,2]", 'expected {"done": [UNIT, ...]'),
        (b'{"done":[1]}', '"done" must list unit names (strings)'),
        (b'{"done":[],"weights":[]}', '"weights" must map each epoch to a list of'),
        (b'{"done":[],"weights":{"0":[{"cats":"x"}]}}', '"weights" must map each epoch'),
        (b"\xff\xfe", "not JSON"),
        (None, "Is a directory"),
    ],
)
def test_a_checkpoint_that_cannot_be_resumed_from_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], neff: Path, work: Path, content: bytes | None, why: str
) -> None:
    """Refused before the daemon is asked (there is none here): exit 2, what is wrong with
    which file, and what to do."""
    make_shards(work / "in", shards=1, per_shard=2)
    out = work / "out"
    out.mkdir(mode=0o700)
    checkpoint = out / ".checkpoint.json"
    if content is None:
        checkpoint.mkdir()
    else:
        checkpoint.write_bytes(content)
    args = ["--input", str(work / "in" / "*"), "--output", str(out), "--resume"]
    code, _, err = run(capsys, neff, *args, "-a", "unix:" + str(work / "none.sock"))
    line = refused(code, err)
    assert f"{checkpoint}: cannot resume from it (" in line and why in line, line
    assert line.endswith("; remove it to start over\n")


@pytest.mark.daemon
@pytest.mark.parametrize("fmt", ["tfrecord", "npy"])
def test_a_unit_done_whose_output_is_missing_or_cut_short_is_done_again(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    daemon: DaemonProcess,
    neff: Path,
    work: Path,
    fmt: str,
) -> None:
    make_shards(work / "in", shards=3, per_shard=6)
    out = work / "out"
    args = ["--input", str(work / "in" / "*"), "--output", str(out), "--format", fmt]
    args += ["-a", daemon.address, "--json"]
    code, _, err = run(capsys, neff, *args)
    assert code == 0, err
    suffix = ".tfrecord" if fmt == "tfrecord" else ".npz"
    first, second, third = sorted(out.glob(f"*{suffix}"))
    whole = third.read_bytes()
    first.unlink()
    second.write_bytes(second.read_bytes()[:-3])
    with caplog.at_level(logging.WARNING, "neuron_rtd.stream"):
        code, lines, err = run(capsys, neff, *args, "--resume")
    assert code == 0, err
    final = json.loads(lines.splitlines()[-1])
    assert (final["units_done"], final["units_skipped"]) == (2, 1)
    for redone in (first, second):
        name = redone.name.removesuffix(suffix)
        assert f"{name}: done by an earlier run, but its output {redone} is missing" in caplog.text
    assert third.read_bytes() == whole and first.exists()
    if fmt == "tfrecord":
        assert len(outputs_of(out)) == 18


def test_a_checkpoint_is_replaced_through_a_temporary(work: Path) -> None:
    checkpoint = Checkpoint(work, resume=False)
    checkpoint.mark(WorkUnit(0, Shard("a.tfrecord")))
    assert json.loads((work / ".checkpoint.json").read_text())["done"] == [
        WorkUnit(0, Shard("a.tfrecord")).name
    ]
    assert Checkpoint(work, resume=True).done == checkpoint.done
    assert [p.name for p in work.iterdir()] == [".checkpoint.json"]


# --- the record size limit --------------------------------------------------------------


@pytest.mark.daemon
def test_a_record_over_max_record_mb_fails_the_run_naming_it(
    capsys: pytest.CaptureFixture[str], daemon: DaemonProcess, neff: Path, work: Path
) -> None:
    (work / "in").mkdir()
    shard = work / "in" / "big.tfrecord"
    with Writer(shard) as writer:
        writer.write(bytes(2 << 20))
    args = ["--input", str(shard), "--output", str(work / "out"), "-a", daemon.address]
    code, _, err = run(capsys, neff, *args, "--max-record-mb", "1")
    assert code == 1, err
    assert err == (
        f"neuron-batch: error: {shard}: the record at offset 0 is 2097152 bytes (2 MiB), over "
        "the limit of 1 MiB: refused unread (--max-record-mb raises the limit)\n"
    )


# --- URLs: http(s) shards, and credentials never said -----------------------------------


def test_credentials_in_urls_are_redacted() -> None:
    assert redact("s3://KEY:SECRET@bucket/x.tfrecord") == "s3://***@bucket/x.tfrecord"
    assert (
        redact("at http://u:p%40ss@h:80/a/b.tfrecord@120.")
        == "at http://***@h:80/a/b.tfrecord@120."
    )
    assert redact("https://token@h/x and s3://b/x.tfrecord@12") == (
        "https://***@h/x and s3://b/x.tfrecord@12"  # a record's key is no user info
    )
    # the URL's credentials in a shape of the store's own, as botocore quotes a bucket
    said = 'Invalid bucket name "KEY:SECRET@b"; secret SECRET, p@ss'
    assert redact(said, "s3://KEY:SECRET@b/x", "http://u:p%40ss@h/") == (
        'Invalid bucket name "***@b"; secret ***, ***'
    )
    assert redact("/data/a@2x.tfrecord") == "/data/a@2x.tfrecord"
    # a unit's name (its outputs', the checkpoint's) holds none, and credentials changed
    # between a run and its resume leave it the same
    one, two = (WorkUnit(0, Shard(f"http://{who}@h/x.tfrecord")) for who in ("u:p1", "v:p2"))
    assert one.name == two.name and "p1" not in one.name


@pytest.fixture
def site(work: Path) -> Iterator[tuple[Path, str]]:
    """A folder served over HTTP on 127.0.0.1 (python's http.server, in a thread), where
    /private/ answers only to Basic auth of USER:PASSWORD; the folder and the server's URL."""
    folder = work / "site"
    folder.mkdir()
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _allowed(self) -> bool:
            if not self.path.startswith("/private/"):
                return True
            if self.headers.get("Authorization") == expected:
                return True
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="shards"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False

        def do_GET(self) -> None:
            if self._allowed():
                super().do_GET()

        def do_HEAD(self) -> None:
            if self._allowed():
                super().do_HEAD()

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(folder))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.daemon
def test_shards_streamed_over_http(
    capsys: pytest.CaptureFixture[str],
    daemon: DaemonProcess,
    neff: Path,
    work: Path,
    site: tuple[Path, str],
) -> None:
    folder, url = site
    xs = make_shards(folder / "a", shards=2, per_shard=5, seed=2)
    xs |= make_shards(folder / "b", shards=1, per_shard=6, seed=3)
    inputs = ["--input", f"{url}/a/part-*.tfrecord", "--input", f"{url}/b/part-00.tfrecord"]
    code, _, err = run(capsys, neff, *inputs, "--output", str(work / "out"), "-a", daemon.address)
    assert code == 0, err
    got = outputs_of(work / "out")  # keyed by the shards' URLs
    assert {k.removeprefix(url) for k in got} == {k.removeprefix(str(folder)) for k in xs}


@pytest.mark.daemon
def test_credentials_in_urls_are_never_said_or_written(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    daemon: DaemonProcess,
    neff: Path,
    work: Path,
    site: tuple[Path, str],
) -> None:
    """Over http with user:password in the URL: the run reads the shards (the server asks
    for them) and says them, writes their keys, progress and summary without them; and so
    do its errors (a corrupt record, a wrong password) and its logs."""
    folder, url = site
    xs = make_shards(folder / "private", shards=2, per_shard=5, seed=4)
    secret_url = url.replace("http://", f"http://{USER}:{PASSWORD}@") + "/private/*.tfrecord"
    out = work / "out"
    said: list[str] = []
    # what reaches stderr (neuron-batch sets no handler: WARNING and up), and ours at any
    # level (fsspec's own DEBUG lines quote URLs whole: never on unless a caller asks)
    caplog.set_level(logging.WARNING)
    caplog.set_level(logging.DEBUG, "neuron_rtd")
    args = ["--input", secret_url, "--output", str(out), "-a", daemon.address]
    code, stdout, err = run(capsys, neff, *args, "--json")
    assert code == 0, err
    said += [stdout, err]
    code, stdout, err = run(capsys, neff, *args, "--overwrite")
    assert code == 0 and "neuron-batch: 10 records in" in stdout, err
    said += [stdout, err]
    got = outputs_of(out)
    assert {k.rsplit("/", 1)[1] for k in got} == {k.rsplit("/", 1)[1] for k in xs}
    assert all(k.startswith("http://***@127.0.0.1:") for k in got)
    written = b"".join(p.read_bytes() for p in out.iterdir())
    assert PASSWORD.encode() not in written and USER.encode() + b":" not in written

    victim = folder / "private" / "part-01.tfrecord"
    data = bytearray(victim.read_bytes())
    data[build_index(victim)[2][0] + 20] ^= 0xFF
    victim.write_bytes(data)
    code, _, err = run(
        capsys, neff, "--input", secret_url, "--output", str(work / "o2"), "-a", daemon.address
    )
    assert code == 1 and "/private/part-01.tfrecord: corrupt record at offset" in err, err
    assert "error: http://***@127.0.0.1:" in err
    said.append(err)

    wrong = secret_url.replace(PASSWORD, "Wr0ngPassw0rd")
    code, _, err = run(capsys, neff, "--input", wrong, "--output", str(work / "o3"))
    assert code == 2 and "--input http://***@127.0.0.1:" in err, err
    assert "Wr0ngPassw0rd" not in err
    said.append(err)
    said.append(caplog.text)
    for text in said:
        assert PASSWORD not in text and "Traceback" not in text, text


def test_s3_credentials_in_an_error_are_not_said(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    neff: Path,
    work: Path,
) -> None:
    """s3fs takes no credentials in a URL: the store's error quotes them as part of the
    bucket's name; said without them."""
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    url = "s3://AKIAEXAMPLEKEY:wJalrXUtnFEMIsecret@bucket/x.tfrecord"
    code, _, err = run(capsys, neff, "--input", url, "--output", str(work / "o"))
    line = refused(code, err)
    assert "--input s3://***@bucket/x.tfrecord: " in line
    assert "wJalrXUtnFEMIsecret" not in line and "AKIAEXAMPLEKEY:" not in line
