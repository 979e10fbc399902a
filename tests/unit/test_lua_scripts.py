"""The store's Lua scripts live in ``celery_extras/scripts/*.lua``; what Redis receives is fixed.

Every script file is loaded by some module and every name loaded has its file (no
orphan, none missing). The scripts the modules compose from those files (a shared
prefix, a body, the ``allow-oom`` flag line) have a fixed SHA1: Redis caches scripts by that
hash, so the same hash is the same script, and a change to what Redis runs shows here.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any

import pytest

import celery_extras
from celery_extras import scripts
from celery_extras.concurrency import redis_slots as slot_store
from celery_extras.delay import redis_store
from celery_extras.limits import redis_bucket as global_bucket
from celery_extras.sync import revoke_store

PACKAGE = Path(celery_extras.__file__).parent

#: SHA1 of each script as sent to Redis (the timed ones since they are told the time: issue 26).
SHA1 = {
    "slot_store.ACQUIRE_SCRIPT": "b92b48866597fca8c06beb962ba5b39d23ce2ad8",
    "slot_store.RELEASE_SCRIPT": "3f4b2fdfe652cfbc964e25e139e80c7a285a6a79",
    "slot_store.RENEW_SCRIPT": "ca8f1e59ee38e3674a4ceee2d151e6a6ce2bf1b4",
    "slot_store.TICKET_SCRIPT": "798d8ff4ddf638cfb40e3d85491cf2fa2596efa1",
    "global_bucket.ACQUIRE_SCRIPT": "9cb5527e8650f7524b00b6a406474fe2a4bbfe9e",
    "revoke_store._WRITE": "fb433594f243355236d11b773fa40cb0ec25d3cd",
    "revoke_store._PROBE": "d10df296eaa33eea0d2edee8d1398f9cf6a796cd",
    "revoke_store._PULL": "94ac9ba0bf9dbed761ddf817574fd23331519195",
    "redis_store.PARK": "509cdaf84f08a5c6a924a1fcafa609754fb63088",
    "redis_store.WITHDRAW": "6ee54e6412c04e402d7cad9c88f09b1bb83c3313",
    "redis_store.DISCARD": "59dac1ffc511b5346aa42928508e93ce5291177f",
    "redis_store.CLAIM": "0617690c59f5c7310aa1a2522dcaec33d3e7e765",
    "redis_store.RELEASE": "2fef3d416f8d7e2005cc760b1b5558e2b5b7e15c",
    "redis_store.TAKE": "34a96497df3f3146bd4bf5ced298319a356a7fb3",
    "redis_store.PURGE": "861ea3d8da80b10258d116babfb9b3540b54961a",
    "redis_store.ALLOW_OOM+CLAIM": "0446687a25426ce8bc11903811293c4e307d6c7d",
    "redis_store.ALLOW_OOM+RELEASE": "9ca54ae6873561fa33b4a7d33b39566d9b85b1d6",
    "redis_store.ALLOW_OOM+TAKE": "f342557000271a1065e5ec0e33c99eea7d807079",
    "redis_store.ALLOW_OOM+PURGE": "4380679898f849c828a84806e03a9393bffb5f5b",
}
MODULES: dict[str, Any] = {
    "slot_store": slot_store,
    "global_bucket": global_bucket,
    "redis_store": redis_store,
    "revoke_store": revoke_store,
}


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()


@pytest.mark.parametrize(("what", "digest"), SHA1.items())
def test_scripts_sent_are_unchanged(what: str, digest: str) -> None:
    module, names = what.split(".", 1)
    text = "".join(getattr(MODULES[module], name) for name in names.split("+"))
    assert sha1(text) == digest


def loaded_names() -> dict[str, list[str]]:
    """``load("<name>")`` calls with a literal name in the package's modules: name -> modules."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if path != PACKAGE / "scripts" / "__init__.py" and not any(
            isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[-1] == "scripts"
            and any(alias.name == "load" for alias in node.names)
            for node in ast.walk(tree)
        ):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "load":
                assert len(node.args) == 1 and isinstance(node.args[0], ast.Constant), (
                    f"{path}: load() takes a literal script name"
                )
                found.setdefault(str(node.args[0].value), []).append(path.name)
    return found


def test_every_script_file_is_loaded_and_every_loaded_name_has_its_file() -> None:
    loaded = loaded_names()
    shipped = scripts.names()
    assert len(shipped) == len(set(shipped)) > 0
    assert sorted(set(shipped) - loaded.keys()) == [], "orphan .lua files"
    assert sorted(loaded.keys() - set(shipped)) == [], "loaded names without a .lua file"
    for name in shipped:
        assert scripts.load(name)


def test_script_files_are_the_documented_header_then_the_text_sent() -> None:
    for name in scripts.names():
        raw = (PACKAGE / "scripts" / f"{name}.lua").read_text(encoding="utf-8")
        header = raw[: len(raw) - len(scripts.load(name))]
        assert raw.endswith(scripts.load(name))
        assert header.startswith("-- "), f"{name}.lua documents its script at the top"
        assert all(line.startswith("--") for line in header.splitlines())
        assert not scripts.load(name).startswith("--")
        # the flag line is composed in Python, first of all: never in a file
        assert not any(line.startswith("#!") for line in raw.splitlines())


def test_load_is_cached_and_strict() -> None:
    assert scripts.load("now_ms") is scripts.load("now_ms")
    with pytest.raises(FileNotFoundError):
        scripts.load("no_such_script")


class FakeScript:
    def __init__(self, text: str) -> None:
        self.text = text


class FakeClient:
    """Records the scripts registered (their text is what ``EVALSHA``/``EVAL`` would send)."""

    def __init__(self) -> None:
        self.registered: list[str] = []

    def register_script(self, text: str) -> FakeScript:
        self.registered.append(text)
        return FakeScript(text)


def test_draining_scripts_send_the_flag_line_first() -> None:
    client = FakeClient()
    store = redis_store.RedisDelayStore(client, "p")  # type: ignore[arg-type]
    flagged = [t for t in client.registered if t.startswith("#!")]
    assert [sha1(t) for t in flagged] == [
        SHA1["redis_store.ALLOW_OOM+CLAIM"],
        SHA1["redis_store.ALLOW_OOM+RELEASE"],
        SHA1["redis_store.ALLOW_OOM+TAKE"],
        SHA1["redis_store.ALLOW_OOM+PURGE"],
    ]
    assert all(t.startswith("#!lua flags=allow-oom\n") for t in flagged)
    assert store._claim._body == redis_store.CLAIM
