"""Writes ray.io_v1.schema.json: the JSON Schema the KubeRay manifests (deploy/kuberay/) are validated against in
tests/test_kuberay_manifests.py. Run once by hand when the pinned versions change:

    pip download kubernetes-validate==1.37.0 --no-deps -d /tmp/kv && unzip -q -o /tmp/kv/*.whl -d /tmp/kv
    python tests/data/kuberay/build_schema.py /tmp/kv/kubernetes_validate/kubernetes-json-schema/v1.33.0-local-strict

What it holds (descriptions dropped, everything else as published):
  * RayJob and RayService of ray.io/v1 as KubeRay v1.5.1 defines them (ray-operator/apis/ray/v1: rayjob_types.go,
    rayservice_types.go, raycluster_types.go), for the fields of RayJobSpec, RayServiceSpec, RayClusterSpec,
    HeadGroupSpec, WorkerGroupSpec, AuthOptions, AutoscalerOptions, GcsFaultToleranceOptions and RedisCredential,
    typed as controller-gen types them, required as their JSON tags make them, and closed (an unknown field is an error, as `kubectl apply`'s strict field
    validation makes it);
  * every pod template, service and container setting as Kubernetes 1.33's own strict schema (PodTemplateSpec and
    what it refers to), from kubernetes-validate (the yannh/instrumenta schemas), and the same for the core objects
    the manifests ship beside them: StorageClass (storage.k8s.io/v1) and PersistentVolumeClaim (v1).
"""
import json
import sys
from pathlib import Path

INT32 = {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1}
STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}


def closed(props: dict, required=()) -> dict:
    out = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


def ref(name: str) -> dict:
    return {"$ref": f"#/$defs/{name}"}


POD = ref("io.k8s.api.core.v1.PodTemplateSpec")
KUBERAY = {
    "ray.io.v1.AuthOptions": closed({"mode": {"type": "string", "enum": ["disabled", "token"]}}),
    "ray.io.v1.AutoscalerOptions": closed({
        "resources": ref("io.k8s.api.core.v1.ResourceRequirements"), "image": {"type": "string"},
        "imagePullPolicy": {"type": "string"}, "env": {"type": "array", "items": ref("io.k8s.api.core.v1.EnvVar")},
        "envFrom": {"type": "array", "items": ref("io.k8s.api.core.v1.EnvFromSource")},
        "volumeMounts": {"type": "array", "items": ref("io.k8s.api.core.v1.VolumeMount")},
        "securityContext": ref("io.k8s.api.core.v1.SecurityContext"), "idleTimeoutSeconds": INT32,
        "upscalingMode": {"type": "string", "enum": ["Default", "Aggressive", "Conservative"]},
        "version": {"type": "string", "enum": ["v1", "v2"]}}),
    "ray.io.v1.HeadGroupSpec": closed({
        "serviceType": {"type": "string"}, "headService": ref("io.k8s.api.core.v1.Service"),
        "enableIngress": {"type": "boolean"}, "rayStartParams": STRMAP, "template": POD,
        "headLabelSelector": STRMAP}, required=["template"]),
    "ray.io.v1.WorkerGroupSpec": closed({
        "groupName": {"type": "string"}, "replicas": INT32, "minReplicas": INT32, "maxReplicas": INT32,
        "numOfHosts": INT32, "idleTimeoutSeconds": INT32, "suspend": {"type": "boolean"},
        "rayStartParams": STRMAP, "template": POD,
        "scaleStrategy": closed({"workersToDelete": {"type": "array", "items": {"type": "string"}}}),
        "labelSelector": STRMAP}, required=["groupName", "maxReplicas", "minReplicas", "template"]),
    "ray.io.v1.RayClusterSpec": closed({
        "authOptions": ref("ray.io.v1.AuthOptions"), "headGroupSpec": ref("ray.io.v1.HeadGroupSpec"),
        "workerGroupSpecs": {"type": "array", "items": ref("ray.io.v1.WorkerGroupSpec")},
        "rayVersion": {"type": "string"}, "enableInTreeAutoscaling": {"type": "boolean"},
        "autoscalerOptions": ref("ray.io.v1.AutoscalerOptions"), "headServiceAnnotations": STRMAP,
        "suspend": {"type": "boolean"}, "managedBy": {"type": "string"},
        "gcsFaultToleranceOptions": ref("ray.io.v1.GcsFaultToleranceOptions")}, required=["headGroupSpec"]),
    "ray.io.v1.GcsFaultToleranceOptions": closed({
        "redisUsername": ref("ray.io.v1.RedisCredential"), "redisPassword": ref("ray.io.v1.RedisCredential"),
        "externalStorageNamespace": {"type": "string"}, "redisAddress": {"type": "string"}}, required=["redisAddress"]),
    "ray.io.v1.RedisCredential": closed({"valueFrom": ref("io.k8s.api.core.v1.EnvVarSource"), "value": {"type": "string"}}),
    "ray.io.v1.RayJobSpec": closed({
        "activeDeadlineSeconds": INT32, "backoffLimit": INT32, "rayClusterSpec": ref("ray.io.v1.RayClusterSpec"),
        "submitterPodTemplate": POD, "metadata": STRMAP, "clusterSelector": STRMAP,
        "submitterConfig": closed({"backoffLimit": INT32}), "managedBy": {"type": "string"},
        "deletionStrategy": {"type": "object"}, "entrypoint": {"type": "string"},
        "runtimeEnvYAML": {"type": "string"}, "jobId": {"type": "string"},
        "submissionMode": {"type": "string", "enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
        "entrypointResources": {"type": "string"}, "entrypointNumCpus": {"type": "number"},
        "entrypointNumGpus": {"type": "number"}, "ttlSecondsAfterFinished": INT32,
        "shutdownAfterJobFinishes": {"type": "boolean"}, "suspend": {"type": "boolean"}}),
    "ray.io.v1.RayServiceSpec": closed({
        "serveConfigV2": {"type": "string"}, "rayClusterConfig": ref("ray.io.v1.RayClusterSpec"),
        "serviceUnhealthySecondThreshold": INT32, "deploymentUnhealthySecondThreshold": INT32,
        "serveService": ref("io.k8s.api.core.v1.Service"), "excludeHeadPodFromServeSvc": {"type": "boolean"},
        "upgradeStrategy": closed({"type": {"type": "string", "enum": ["NewCluster", "None",
                                                                       "NewClusterWithIncrementalUpgrade"]},
                                   "clusterUpgradeOptions": {"type": "object"}})}, required=["rayClusterConfig"]),
}
CORE = ["io.k8s.api.storage.v1.StorageClass", "io.k8s.api.core.v1.PersistentVolumeClaim"]  # weights.yaml, storageclass.yaml


def root(kind: str, spec: str) -> dict:
    return closed({"apiVersion": {"const": "ray.io/v1"}, "kind": {"const": kind},
                   "metadata": ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"), "spec": ref(spec)},
                  required=["apiVersion", "kind", "metadata", "spec"])


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


def main(k8s_dir: str) -> None:
    defs = json.loads((Path(k8s_dir) / "_definitions.json").read_text())["$defs"]
    needed = sorted({r["$ref"].split("/")[-1] for d in KUBERAY.values() for r in _refs(d)} - set(KUBERAY)) + CORE
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              "$comment": "KubeRay v1.5.1 ray.io/v1 RayJob and RayService, Kubernetes 1.33 pod templates, "
                          "StorageClass and PersistentVolumeClaim "
                          "(tests/data/kuberay/build_schema.py)",
              "$defs": {**closure(defs, needed), **KUBERAY,
                        "ray.io.v1.RayJob": root("RayJob", "ray.io.v1.RayJobSpec"),
                        "ray.io.v1.RayService": root("RayService", "ray.io.v1.RayServiceSpec")}}
    out = Path(__file__).with_name("ray.io_v1.schema.json")
    out.write_text(json.dumps(schema, indent=None, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"{out}: {len(schema['$defs'])} definitions, {out.stat().st_size} bytes")


def _refs(node):
    if isinstance(node, dict):
        if "$ref" in node:
            yield node
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


if __name__ == "__main__":
    main(sys.argv[1])
