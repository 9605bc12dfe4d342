"""Where records come from: shards named by paths, globs or fsspec URLs, read in ranged
requests with read-ahead (a shard is never downloaded whole first), in an order shuffled
per epoch, and classes of shards interleaved by weights that may change during a run.

- `expand(inputs)`: local paths and globs (`data/*.tfrecord`), and any fsspec URL
  (`s3://bucket/train-*.tfrecord` through s3fs, `http(s)://host/train-*.tfrecord`,
  `memory://...`); sorted, each a `Shard`.
- `redact(text, *urls)`: the credentials of URLs hidden, in all that is said of them (errors,
  logs, the keys written in the outputs).
- `shard_records(shard, ...)`: a shard's records (GZIP/ZLIB by its name), from an offset.
- `epoch_order(shards, seed, epoch)`: the shards of one epoch, shuffled with `seed` and
  the epoch number (the same order for the same run), or as given with no seed.
- A manifest names shards per class with weights: JSON `{"classes": {"cats": {"weight":
  2, "shards": [...]}, ...}}`, or augmented-manifest JSON lines, one shard a line:
  `{"source-ref": "s3://.../a.tfrecord", "class": "cats", "weight": 2}`.
- `Interleave`: records of each class's stream, drawn at random in proportion to the
  weights `weights()` gives now (read again every `reweigh_every` records: a callback,
  or the manifest file read again, for dynamic boosting); a finished class drops out.
"""

from __future__ import annotations

import glob
import json
import logging
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import unquote

import fsspec

from neuron_rtd.records.tfrecord import (
    MAX_RECORD_BYTES,
    CorruptRecord,
    OnCorrupt,
    ReadStats,
    Record,
    RecordTooLarge,
    guess_compression,
    read_raw,
)

log = logging.getLogger("neuron_rtd.stream")

READ_AHEAD_BYTES = 8 << 20  # each ranged read of a remote shard, and what it reads ahead


@dataclass(frozen=True)
class Shard:
    url: str  # a local path or an fsspec URL
    label: str = ""  # its class, from a manifest


def _is_url(text: str) -> bool:
    return "://" in text


# a URL's scheme, then its user info: up to an @ before the host's end (RFC 3986: no /, ?
# or # in it unencoded), so that a record's key (`s3://b/x.tfrecord@120`) is no match
_USER_INFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^\s/?#@]*)@")


def redact(text: str, *urls: str) -> str:
    """`text` with the credentials of URLs hidden: any URL's user info in it
    (`s3://KEY:SECRET@b/x` -> `s3://***@b/x`), and that of each of `urls` wherever else it
    appears (an error quoting the URL in a shape of its own, as botocore's `Invalid bucket
    name "KEY:SECRET@b"`). Whatever neuron-batch says or writes of a URL goes through it."""
    for url in urls:
        for secret in _secrets(url):
            text = text.replace(secret, "***")
    return _USER_INFO.sub(r"\g<scheme>***@", text)


def _secrets(url: str) -> list[str]:
    """A URL's user info, and its password, as written and decoded; longest first."""
    found = _USER_INFO.match(url)
    if found is None:
        return []
    info = found["info"]
    password = info.partition(":")[2]
    secrets = {info, password, unquote(info), unquote(password)} - {""}
    return sorted(secrets, key=len, reverse=True)


class StorageError(OSError):
    """What the storage failed to give: which shard or input, and why."""


def _why(exc: BaseException) -> str:
    """What went wrong, on one line."""
    said = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


def _is_file(fs: fsspec.AbstractFileSystem, path: str) -> bool:
    try:
        return bool(fs.info(path)["type"] == "file")
    except FileNotFoundError:
        return False


def expand(inputs: Sequence[str], label: str = "", where: str = "--input") -> list[Shard]:
    """The shards the inputs name, each input's sorted; ValueError for one naming none,
    StorageError for a store that cannot be asked (unreachable, no credentials, an
    unknown protocol); `where` says where the input was given."""
    shards: list[Shard] = []
    for text in inputs:
        if _is_url(text):
            try:
                fs, _, paths = fsspec.get_fs_token_paths(text)
                protocol = text.split("://", 1)[0]
                found = sorted(_with_scheme(p, protocol) for p in paths if _is_file(fs, p))
            except Exception as exc:  # the store's own errors, botocore's and the like
                raise StorageError(redact(f"{where} {text}: {_why(exc)}", text)) from None
        elif glob.has_magic(text):
            found = sorted(p for p in glob.glob(text) if Path(p).is_file())
        else:
            found = [text] if Path(text).is_file() else []
        if not found:
            raise ValueError(redact(f"{where} {text}: no file there", text))
        shards.extend(Shard(url, label) for url in found)
    return shards


def _with_scheme(path: str, protocol: str) -> str:
    """A path an fsspec store found, as a URL: most stores give theirs without the scheme
    (`bucket/key`), http's with it."""
    return path if _is_url(path) else f"{protocol}://{path}"


def open_shard(shard: Shard, read_ahead: int = READ_AHEAD_BYTES) -> IO[bytes]:
    """The shard's raw bytes: a local file, or a remote one read in ranged requests of
    `read_ahead` bytes."""
    if not _is_url(shard.url):
        return open(shard.url, "rb")
    fs, path = fsspec.core.url_to_fs(shard.url)
    opened: IO[bytes] = fs.open(path, "rb", block_size=read_ahead, cache_type="background")
    return opened


def shard_records(
    shard: Shard,
    *,
    on_corrupt: OnCorrupt = "fail",
    stats: ReadStats | None = None,
    start: int = 0,
    read_ahead: int = READ_AHEAD_BYTES,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> Iterator[Record]:
    """The records of one shard, from uncompressed offset `start` on, named by its URL
    with no credentials. What the storage fails (a file gone, a server that stops
    answering) is a StorageError naming the shard."""
    try:
        with open_shard(shard, read_ahead) as raw:
            yield from read_raw(
                raw,
                redact(shard.url),
                guess_compression(shard.url),
                on_corrupt=on_corrupt,
                stats=stats,
                start=start,
                max_record_bytes=max_record_bytes,
            )
    except (CorruptRecord, RecordTooLarge, StorageError):
        raise
    except Exception as exc:  # the storage's own errors: OSError, botocore's, aiohttp's...
        raise StorageError(redact(f"{shard.url}: {_why(exc)}", shard.url)) from None


def epoch_order(shards: Sequence[Shard], seed: int | None, epoch: int) -> list[Shard]:
    """The shards of one epoch: shuffled by (seed, epoch), or as given without a seed."""
    order = list(shards)
    if seed is not None:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


# --- manifests and weights -----------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    shards: dict[str, list[Shard]]  # class -> its shards
    weights: dict[str, float]  # class -> weight


def read_manifest(path: str | Path, *, resolve: bool = True) -> Manifest:
    """A manifest file (see the module doc); ValueError naming what is wrong (a class of
    no shard, every weight 0). `resolve` False: its weights only, the shards not looked
    for (as a run reads it again every batch)."""
    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "classes" in doc:
        manifest = _classes_manifest(doc, str(path), resolve)
    else:
        manifest = _augmented_manifest(text, str(path), resolve)
    if not any(manifest.weights.values()):
        raise ValueError(f"{path}: every class's weight is 0: nothing would be drawn")
    return manifest


def _weight(value: object, where: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{where}: weight must be a number >= 0, not {value!r}")
    return float(value)


def _classes_manifest(doc: dict[str, object], path: str, resolve: bool) -> Manifest:
    classes = doc.get("classes")
    if not isinstance(classes, dict) or not classes:
        raise ValueError(
            f'{path}: expected {{"classes": {{NAME: {{"weight": W, "shards": [...]}}}}}}'
        )
    shards: dict[str, list[Shard]] = {}
    weights: dict[str, float] = {}
    for name, entry in classes.items():
        where = f"{path}: class {name!r}"
        if not isinstance(entry, dict) or not isinstance(entry.get("shards"), list):
            raise ValueError(f'{where}: expected {{"weight": W, "shards": [...]}}')
        weights[name] = _weight(entry.get("weight", 1), where)
        if not entry["shards"]:
            raise ValueError(f"{where}: names no shard")
        named = [str(s) for s in entry["shards"]]
        shards[name] = expand(named, name, f"{where}: shard") if resolve else []
    return Manifest(shards, weights)


def _augmented_manifest(text: str, path: str, resolve: bool) -> Manifest:
    shards: dict[str, list[Shard]] = {}
    weights: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON: {exc.msg}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("source-ref"), str):
            raise ValueError(f'{where}: expected {{"source-ref": URL, "class": NAME}}')
        label = str(entry.get("class", ""))
        found = expand([entry["source-ref"]], label, f"{where}: source-ref") if resolve else []
        shards.setdefault(label, []).extend(found)
        if "weight" in entry:
            weights[label] = _weight(entry["weight"], where)
        weights.setdefault(label, 1.0)
    if not shards:
        raise ValueError(f"{path}: names no shard")
    return Manifest(shards, weights)


class ManifestWeights:
    """The weights of a manifest file, read again at each call (dynamic boosting): a file
    that cannot be read or parsed now, or whose weights are all 0 (a file being rewritten,
    a slip), keeps the last weights, with a warning."""

    def __init__(self, path: str | Path, first: Mapping[str, float]) -> None:
        self.path = path
        self.last = dict(first)

    def __call__(self) -> dict[str, float]:
        try:
            self.last = dict(read_manifest(self.path, resolve=False).weights)
        except (OSError, ValueError) as exc:
            log.warning("%s (the last weights stay)", exc)
        return self.last


class Interleave:
    """Records of several classes' streams, drawn in proportion to their weights."""

    def __init__(
        self,
        streams: Mapping[str, Iterator[Record]],
        weights: Callable[[], Mapping[str, float]],
        *,
        seed: int | None = None,
        reweigh_every: int = 64,
        replay: Sequence[Mapping[str, float]] = (),
    ) -> None:
        """`replay`: the weights an earlier run read, used again in their turn before
        `weights` is asked (so that a resumed run draws the same records)."""
        self._streams = dict(streams)
        self._weights = weights
        self._rng = random.Random(seed)
        self._reweigh_every = reweigh_every
        self._replay = list(replay)
        self.history: list[dict[str, float]] = []  # the weights of each re-read, in turn
        self.drawn: dict[str, int] = dict.fromkeys(self._streams, 0)

    def _read_weights(self) -> dict[str, float]:
        turn = len(self.history)
        current = dict(self._replay[turn]) if turn < len(self._replay) else dict(self._weights())
        self.history.append(current)
        return current

    def __iter__(self) -> Iterator[Record]:
        current = self._read_weights()
        count = 0
        while self._streams:
            if count and count % self._reweigh_every == 0:
                current = self._read_weights()
            names = [n for n in self._streams if current.get(n, 0.0) > 0]
            if not names:
                return  # every class left has weight 0
            name = self._rng.choices(names, [current[n] for n in names])[0]
            record = next(self._streams[name], None)
            if record is None:
                del self._streams[name]
                continue
            self.drawn[name] += 1
            count += 1
            yield record
