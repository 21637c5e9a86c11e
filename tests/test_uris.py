"""A URI wherever a path is: routing tables and router artifacts on a real S3 API (moto's server on 127.0.0.1),
the endpoint given in the URI or by AWS_ENDPOINT_URL, and one clear error for each way a location can be unusable."""
import re
import socket

import numpy as np
import pytest
from conftest import blobs

from proxray import KMeansRouter, KNNRouter, RoutingTable
from proxray.cli import main
from proxray.common.storage import check_location
from proxray.pool.simulated import make_table
from proxray.routing.artifact import ArtifactError, current_version, versions
from proxray.routing.registry import load_router


def at(uri: str, rel: str) -> str:
    """``rel`` inside the folder URI (its endpoint query kept)."""
    path, _, query = uri.partition("?")
    return f"{path}/{rel}?{query}"


def keys(client, prefix):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket="runs", Prefix=prefix).get("Contents", []))


@pytest.mark.parametrize("name", ["t.parquet", "t.csv", "t.jsonl"])
def test_a_table_goes_to_s3_and_back(s3, tmp_path, monkeypatch, name):
    uri, client, _ = s3
    monkeypatch.chdir(tmp_path)
    table = make_table(3, seed=1)
    assert table.write(at(uri, name)) == at(uri, name)
    assert keys(client, "job/") == [f"job/{name}"] and list(tmp_path.iterdir()) == []  # nothing on local disk
    back = RoutingTable.read(at(uri, name))
    assert back.models == table.models and back.query_ids == table.query_ids
    np.testing.assert_allclose(back.matrices()[0], table.matrices()[0])


def test_aws_endpoint_url_names_the_store_for_every_s3_uri(s3, monkeypatch):
    uri, client, endpoint = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    make_table(2, seed=2).write("s3://runs/plain/t.parquet")  # no endpoint in the URI
    assert keys(client, "plain/") == ["plain/t.parquet"]
    assert RoutingTable.read("s3://runs/plain/t.parquet").n_queries == make_table(2, seed=2).n_queries


@pytest.mark.parametrize("cls,kw", [(KNNRouter, {"k": 10}), (KMeansRouter, {"n_clusters": 4})])
def test_a_router_artifact_on_s3_is_complete_before_its_pointer_moves_and_cached_by_checksum(
        s3, tmp_path, monkeypatch, cls, kw):
    uri, client, _ = s3
    monkeypatch.setenv("PROXRAY_CACHE", str(tmp_path / "cache"))
    X, acc, cost, _ = blobs(np.random.default_rng(3))
    r = cls(**kw, temperature="auto").fit(X, acc, cost, encoder_id="enc")
    art = at(uri, "routers/r")
    v1 = r.save(art)
    objects = keys(client, "job/routers/r/")
    name = v1.split("?")[0].rsplit("/", 1)[1]
    assert objects[0] == "job/routers/r/CURRENT" and f"job/routers/r/{name}/manifest.json" in objects
    assert not [k for k in objects if ".tmp" in k]
    back = cls.load(art, encoder_id="enc")
    np.testing.assert_array_equal(back.estimate(X[:7])[0], r.estimate(X[:7])[0])
    assert back.temperature_ == r.temperature_ and current_version(art) == v1 and versions(art) == [name]
    cached = sorted((tmp_path / "cache" / "artifacts").iterdir())
    assert len(cached) == len({**r._state(), **r._provenance()})  # one file per array, by its checksum
    # a second replica on the node reads the cache, not the store: the store's copy may even be gone
    for k in keys(client, f"job/routers/r/{name}/"):
        if k.endswith(".npy"):
            client.delete_object(Bucket="runs", Key=k)
    np.testing.assert_array_equal(load_router(art).estimate(X[:7])[0], r.estimate(X[:7])[0])
    # a corrupted array is refused by its checksum on download
    monkeypatch.setenv("PROXRAY_CACHE", str(tmp_path / "other-node"))
    v2 = r.save(art)
    name2 = v2.split("?")[0].rsplit("/", 1)[1]
    victim = next(k for k in keys(client, f"job/routers/r/{name2}/") if k.endswith(".npy"))
    client.put_object(Bucket="runs", Key=victim, Body=b"not the array")
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        load_router(art)
    with pytest.raises(ArtifactError, match="fitted on embeddings of encoder 'enc', not 'other'"):
        load_router(art, encoder_id="other")


def test_fit_reads_an_s3_table_and_writes_an_s3_router(s3, tmp_path, monkeypatch):
    uri, client, _ = s3
    monkeypatch.chdir(tmp_path)
    make_table(4, seed=3).write(at(uri, "t.parquet"))
    assert main(["fit", "--table", at(uri, "t.parquet"), "--router", "knn", "--k", "10",
                 "--out", at(uri, "routers/knn")]) == 0
    r = load_router(at(uri, "routers/knn"), encoder_id="sentence-transformers/all-MiniLM-L6-v2")
    assert r.n_train_ == make_table(4, seed=3).n_queries
    assert "job/routers/knn/CURRENT" in keys(client, "job/routers/knn/")
    assert main(["info", at(uri, "t.parquet")]) == 0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_location_that_cannot_be_used_says_why_before_any_work(s3, capsys):
    uri, client, endpoint = s3
    host = endpoint.split("//")[1]
    for bad, why in (("nosuch://bucket/x", "Unrecognized filesystem type"),
                     ("s3://runs/x?bogus_option=1", "Unexpected query parameter")):
        with pytest.raises(ValueError, match=f"--table: {re.escape(repr(bad))}: not a usable filesystem URI .*{why}"):
            check_location(bad, "--table")
    with pytest.raises(ValueError, match="the bucket does not exist"):
        check_location(f"s3://no-such-bucket/x?endpoint_override={host}&scheme=http&region=us-east-1", "--out",
                       write=True)
    with pytest.raises(ValueError, match="unreachable"):
        check_location(f"s3://runs/x?endpoint_override=127.0.0.1:{closed_port()}&scheme=http&region=us-east-1"
                       "", "--out", write=True)
    with pytest.raises(FileNotFoundError, match="routing table .*: no such file"):
        RoutingTable.read(at(uri, "missing.parquet"))
    # the command line says it before reading or encoding anything
    assert main(["fit", "--table", at(uri, "missing.parquet"), "--out", at(uri, "r")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "encoding" not in err
    bad_out = f"s3://no-such-bucket/r?endpoint_override={host}&scheme=http&region=us-east-1"
    make_table(2).write(at(uri, "t.parquet"))
    assert main(["fit", "--table", at(uri, "t.parquet"), "--out", bad_out]) == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.slow
def test_the_served_app_loads_its_router_from_s3(s3, tmp_path, encoder, monkeypatch):
    """``router: s3://…`` in the app args: build_app reads its manifest before any replica starts, each ingress
    replica downloads the arrays into its node's cache by checksum, and routed answers name the URI."""
    import openai
    from serve_helpers import STRONG, WEAK, start_app, stop_app

    uri, client, _ = s3
    monkeypatch.setenv("PROXRAY_CACHE", str(tmp_path / "cache"))
    models = [{"id": m, "engine": "sim"} for m in (WEAK, STRONG)]
    art = at(uri, "routers/served")
    from serve_helpers import fit_router

    fit_router(tmp_path / "local", encoder, [WEAK, STRONG])
    load_router(tmp_path / "local").save(art)
    try:
        base = start_app(tmp_path, encoder, models, router=art)
        answer = openai.OpenAI(base_url=base + "/v1", api_key="unused").chat.completions.create(
            model="proxray", messages=[{"role": "user", "content": "What is 12 times 7?"}])
        report = answer.model_extra["proxray"]
        assert report["routed"] and report["router_path"] == art and answer.model in (WEAK, STRONG)
        # reference, accuracies, costs; the training queries' ids and tasks, the outlier threshold
        assert len(list((tmp_path / "cache" / "artifacts").iterdir())) == 6
    finally:
        stop_app()
    with pytest.raises(ValueError, match="invalid app args: router: .*no manifest.json"):
        from proxray.serve.app import build_app

        build_app({"router": at(uri, "routers/none"), "models": models})


def test_credentials_the_store_refuses_are_named_as_such(tmp_path, monkeypatch):
    """An S3 API that checks credentials (moto's server with its IAM checks on, a process of its own): a key it does
    not know is reported as access denied, naming where credentials come from."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    import httpx

    port = closed_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:  # wait until it answers
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        uri = f"s3://runs/x?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        with pytest.raises(ValueError, match=r"--out s3://runs/x.*: access denied: no valid credentials .*instance role"):
            check_location(uri, "--out", write=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
