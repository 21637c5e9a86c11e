"""Writes ray.io_v1.schema.json: the JSON Schema the KubeRay manifests (deploy/kuberay/) are validated against in
tests/test_kuberay_manifests.py. Run once by hand when the pinned versions change:

    pip download kubernetes-validate==1.37.0 --no-deps -d /tmp/kv && unzip -q -o /tmp/kv/*.whl -d /tmp/kv
    git clone -q --depth 1 --branch v1.5.1 https://github.com/ray-project/kuberay /tmp/kuberay
    python tests/data/kuberay/build_schema.py /tmp/kv/kubernetes_validate/kubernetes-json-schema/v1.33.0-local-strict \
        /tmp/kuberay/ray-operator/config/crd/bases

What it holds (descriptions dropped, everything else as published):
  * RayJob and RayService of ray.io/v1 from KubeRay v1.5.1's own CRD files (ray.io_rayjobs.yaml,
    ray.io_rayservices.yaml: the `openAPIV3Schema` the API server validates against), converted to JSON Schema
    2020-12 and closed as the API server's strict field validation (`kubectl apply`'s default) makes them: an object
    with `properties` and no `x-kubernetes-preserve-unknown-fields` refuses a field it does not name; int32 bounded,
    int-or-string either; and two of the operator's own checks (ray-operator/controllers/ray/utils/validation.go:
    the upgrade strategy's three types, no `labels` in a group's rayStartParams — the group's `labels` field instead).
    Not checked here: the CRDs' CEL rules (`x-kubernetes-validations`) and the operator's other checks;
  * every pod template and service in them as Kubernetes 1.33's own strict schema (PodTemplateSpec, Service and what
    they refer to, from kubernetes-validate: the yannh/instrumenta schemas) instead of the CRD's inlined copy, and the
    same for the core objects the manifests ship beside them: StorageClass (storage.k8s.io/v1),
    PersistentVolumeClaim (v1), and Redis's Deployment (apps/v1) and Service (v1).
"""
import json
import sys
from pathlib import Path

import yaml

INT32 = {"minimum": -2**31, "maximum": 2**31 - 1}
POD = "io.k8s.api.core.v1.PodTemplateSpec"
SERVICE = "io.k8s.api.core.v1.Service"
CORE = ["io.k8s.api.storage.v1.StorageClass", "io.k8s.api.core.v1.PersistentVolumeClaim",  # weights, storageclass
        "io.k8s.api.apps.v1.Deployment", "io.k8s.api.core.v1.Service"]  # redis.yaml
KINDS = {"RayJob": "ray.io_rayjobs.yaml", "RayService": "ray.io_rayservices.yaml"}
VERSION = "v1.5.1"


def ref(name: str) -> dict:
    return {"$ref": f"#/$defs/{name}"}


def is_pod_template(node: dict) -> bool:
    props = node.get("properties") or {}
    return "containers" in ((props.get("spec") or {}).get("properties") or {}) and "metadata" in props


def is_service(node: dict) -> bool:
    props = node.get("properties") or {}
    return "ports" in ((props.get("spec") or {}).get("properties") or {}) and "status" in props \
        and "loadBalancer" in ((props.get("status") or {}).get("properties") or {})


def convert(node):
    """One node of a CRD's structural schema as JSON Schema 2020-12, closed where the API server is strict."""
    if isinstance(node, list):
        return [convert(v) for v in node]
    if not isinstance(node, dict):
        return node
    if is_pod_template(node):
        return ref(POD)
    if is_service(node):
        return ref(SERVICE)
    out = {}
    for k, v in node.items():
        if k in ("description", "format", "nullable") or k.startswith("x-kubernetes-"):
            continue
        if k == "properties":
            out[k] = {name: convert(sub) for name, sub in v.items()}
        elif k in ("items", "additionalProperties", "allOf", "anyOf", "oneOf", "not"):
            out[k] = convert(v)
        else:
            out[k] = v
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("type") == "integer" and node.get("format") == "int32":
        out.update(INT32)
    if "properties" in node and "additionalProperties" not in node \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def operator_checks(spec: dict, kind: str) -> None:
    """validation.go's checks that a schema can say, added to the converted CRD in place."""
    cluster = spec["properties"]["rayClusterSpec" if kind == "RayJob" else "rayClusterConfig"]["properties"]
    for group in (cluster["headGroupSpec"], cluster["workerGroupSpecs"]["items"]):
        group["properties"]["rayStartParams"]["propertyNames"] = {"not": {"const": "labels"}}
    if kind == "RayService":
        spec["properties"]["upgradeStrategy"]["properties"]["type"]["enum"] = [
            "NewClusterWithIncrementalUpgrade", "NewCluster", "None"]


def crd_root(crd_dir: Path, kind: str) -> dict:
    crd = yaml.safe_load((crd_dir / KINDS[kind]).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = version["schema"]["openAPIV3Schema"]
    spec = convert(schema["properties"]["spec"])
    operator_checks(spec, kind)
    return {"type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": "ray.io/v1"}, "kind": {"const": kind},
                           "metadata": ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"), "spec": spec}}


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def closure(defs: dict, names: list) -> dict:
    out, todo = {}, list(names)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out[name] = strip(defs[name])
        for r in json.dumps(out[name]).split('"$ref": "#/$defs/')[1:]:
            todo.append(r.split('"')[0])
    return out


def main(k8s_dir: str, crd_dir: str) -> None:
    defs = json.loads((Path(k8s_dir) / "_definitions.json").read_text())["$defs"]
    roots = {f"ray.io.v1.{kind}": crd_root(Path(crd_dir), kind) for kind in KINDS}
    needed = sorted({r.split('"')[0] for d in roots.values() for r in json.dumps(d).split('"$ref": "#/$defs/')[1:]})
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              "$comment": f"KubeRay {VERSION}'s ray.io/v1 RayJob and RayService CRDs, Kubernetes 1.33 pod templates, "
                          "services, StorageClass, PersistentVolumeClaim and Deployment (tests/data/kuberay/build_schema.py)",
              "$defs": {**closure(defs, needed + CORE), **roots}}
    out = Path(__file__).with_name("ray.io_v1.schema.json")
    out.write_text(json.dumps(schema, indent=None, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"{out}: {len(schema['$defs'])} definitions, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
