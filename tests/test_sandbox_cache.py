"""The answer cache is a file: nothing in it may become code in the kernel (issue 17).

Values are JSON in SQLite; an older pickled cache (diskcache's ``cache.db``) in the same
folder is never opened; a row that is not an answer is a miss. The sandbox does not see
the folder at all (tests/test_sandbox_attacks.py)."""

from __future__ import annotations

import json
import pickle
import sqlite3

from rlm_magic.llm.cache import FILE_NAME

from .support import helpers, make_rlm


class Trap:
    """Unpickling this writes a marker file: proof the kernel ran a payload."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


async def test_an_old_pickled_cache_is_never_loaded(server, tmp_path):
    marker = tmp_path / "unpickled"
    old = sqlite3.connect(tmp_path / "cache.db")  # where diskcache kept its pickles
    old.execute("CREATE TABLE Cache (key BLOB, value BLOB)")
    old.execute("INSERT INTO Cache VALUES (?, ?)", (b"k", pickle.dumps(Trap(str(marker)))))
    old.commit()
    old.close()
    rlm = make_rlm(server, cache=True, cache_dir=str(tmp_path))
    assert await helpers(rlm).llm_query("hello") == "echo: hello"
    assert (
        await helpers(make_rlm(server, cache=True, cache_dir=str(tmp_path))).llm_query("hello")
        == "echo: hello"
    )
    assert not marker.exists()
    assert len(server.requests_for("sub-model")) == 1  # the second came from the cache


async def test_the_cache_stores_json_and_a_row_that_is_not_an_answer_is_a_miss(server, tmp_path):
    rlm = make_rlm(server, cache=True, cache_dir=str(tmp_path))
    await helpers(rlm).llm_query("hello")
    db = sqlite3.connect(tmp_path / FILE_NAME)
    [(key, value)] = db.execute("SELECT key, value FROM answers").fetchall()
    assert json.loads(value)["text"] == "echo: hello"

    db.execute("UPDATE answers SET value = ?", (json.dumps({"text": ["not", "text"]}),))
    db.commit()
    db.close()
    again = make_rlm(server, cache=True, cache_dir=str(tmp_path))
    assert await helpers(again).llm_query("hello") == "echo: hello"
    assert len(server.requests_for("sub-model")) == 2  # asked again, not served the row
