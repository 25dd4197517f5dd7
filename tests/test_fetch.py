"""mae-study fetch against a local HTTP server (http.server in a thread) serving files the tests
write: a file whose decompressed bytes match its SHA-256 is kept, a wrong one is refused and
nothing is left behind."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from mae_core import named_datasets
from studies.cli import main
from studies.fetch import FetchError, fetch_files


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the server's request lines are not the command's output
        pass


@pytest.fixture
def server(tmp_path):
    """A local server of the folder ``served`` -> (that folder, its base URL)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def _serve(folder: Path, name: str, content: bytes) -> str:
    """Write ``name`` gzipped into the served folder; the SHA-256 of its decompressed bytes."""
    (folder / name).write_bytes(gzip.compress(content))
    return hashlib.sha256(content).hexdigest()


def test_good_files_are_kept(server, tmp_path):
    served, url = server
    files = {"a-idx1-ubyte.gz": _serve(served, "a-idx1-ubyte.gz", b"first file"),
             "b-idx3-ubyte.gz": _serve(served, "b-idx3-ubyte.gz", b"second file" * 1000)}
    paths = fetch_files(files, url, tmp_path / "data" / "set")
    assert [p.name for p in paths] == list(files)
    assert gzip.decompress(paths[1].read_bytes()) == b"second file" * 1000
    assert sorted(p.name for p in (tmp_path / "data" / "set").iterdir()) == sorted(files)  # no temporary file left
    (served / "a-idx1-ubyte.gz").unlink()  # fetched again: what is there and right is kept, not downloaded
    assert fetch_files(files, url, tmp_path / "data" / "set") == paths


def test_a_wrong_checksum_is_refused_and_nothing_is_left(server, tmp_path):
    served, url = server
    files = {"a-idx1-ubyte.gz": _serve(served, "a-idx1-ubyte.gz", b"first file"),
             "b-idx3-ubyte.gz": hashlib.sha256(b"what the publisher made").hexdigest()}
    _serve(served, "b-idx3-ubyte.gz", b"something else")
    with pytest.raises(FetchError, match=r"b-idx3-ubyte.gz: SHA-256 of its decompressed bytes is [0-9a-f]{64}, "
                                         r"expected [0-9a-f]{64}; nothing was kept"):
        fetch_files(files, url, tmp_path / "data" / "set")
    assert not (tmp_path / "data").exists()  # the good first file went too, and the folders made for it


def test_the_cli_refuses_a_wrong_file_in_one_line(server, tmp_path, monkeypatch, capsys):
    served, url = server
    for name in named_datasets.FASHION_MNIST.sha256:
        _serve(served, name, b"not Fashion-MNIST")
    monkeypatch.setenv("MAE_STUDY_FETCH_URL", url)
    with pytest.raises(SystemExit) as stop:
        main(["fetch", "fashion_mnist", "--to", str(tmp_path / "data")])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in err and "nothing was kept" in err
    assert not (tmp_path / "data").exists()


def test_the_cli_names_a_missing_file_and_an_unknown_dataset(server, tmp_path, monkeypatch, capsys):
    _, url = server  # serves nothing
    monkeypatch.setenv("MAE_STUDY_FETCH_URL", url)
    with pytest.raises(SystemExit) as stop:
        main(["fetch", "fashion_mnist", "--to", str(tmp_path / "data")])
    assert stop.value.code == 2 and "cannot download " + url + "train-images-idx3-ubyte.gz" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["fetch", "cifar10"])
    assert stop.value.code == 2 and "not a named dataset; known: fashion_mnist" in capsys.readouterr().err


SYSTEM_COPY = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not SYSTEM_COPY.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_the_pinned_hashes_are_fashion_mnists(server, tmp_path, monkeypatch, capsys):
    """Debian's files (recompressed, the same bytes inside) pass the pinned hashes, and the
    command's next step finds them."""
    served, url = server
    for name in named_datasets.FASHION_MNIST.sha256:
        (served / name).symlink_to(SYSTEM_COPY / name)
    monkeypatch.setenv("MAE_STUDY_FETCH_URL", url)
    monkeypatch.setenv("MAE_STUDY_DATA", str(tmp_path / "data"))
    assert main(["fetch", "fashion_mnist"]) == 0
    captured = capsys.readouterr()
    assert "4 files in " + str(tmp_path / "data" / "fashion-mnist") in captured.out
    assert "next: mae-study train dataset=fashion_mnist --smoke" in captured.err
    assert named_datasets.locate("fashion_mnist") == tmp_path / "data" / "fashion-mnist"
