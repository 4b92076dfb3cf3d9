#!/usr/bin/env python3
"""Checks the API server's dry-run output of one rendered chart (a kubectl List in JSON).

  check_rendered.py OUT.json [--expect KIND ...]

Every container (and init container) of every workload runs as non-root with a read-only root
file system, no privilege escalation, all capabilities dropped and the RuntimeDefault seccomp
profile; the agents' NetworkPolicy admits gRPC only from the controller's pods; the agents get
no service-account token; ServiceMonitors and PodMonitors keep the targets' own labels
(honorLabels: both components export MultiModelJobs' `job` and `namespace`); the controller
runs with --leader-elect, and with --agent-tls-server-name wherever it has --agent-tls-ca-file;
the agent runs hydra-agent itself and advertises $(POD_IP); its node name comes from
spec.nodeName. --expect names kinds that must be present.
"""
import json
import sys

WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}


def main():
    path = sys.argv[1]
    expect = sys.argv[sys.argv.index("--expect") + 1:] if "--expect" in sys.argv else []
    with open(path) as f:
        doc = json.load(f)
    items = doc["items"] if doc.get("kind") == "List" else [doc]
    errors = []
    kinds = {}
    for o in items:
        kinds.setdefault(o["kind"], []).append(o)
    for k in expect:
        if k not in kinds:
            errors.append(f"no {k} rendered")

    def component(o):
        return o["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")

    for o in items:
        if o["kind"] not in WORKLOADS:
            continue
        name = f'{o["kind"]}/{o["metadata"]["name"]}'
        pod = o["spec"]["template"]["spec"]
        psc = pod.get("securityContext", {})
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f'{name} container {c["name"]}'
            sc = c.get("securityContext", {})
            if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
                errors.append(f"{where}: runAsNonRoot is not true")
            if sc.get("runAsUser", psc.get("runAsUser")) == 0:
                errors.append(f"{where}: runAsUser is 0")
            if not sc.get("readOnlyRootFilesystem"):
                errors.append(f"{where}: readOnlyRootFilesystem is not true")
            if sc.get("allowPrivilegeEscalation") is not False:
                errors.append(f"{where}: allowPrivilegeEscalation is not false")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                errors.append(f"{where}: capabilities do not drop ALL")
            if sc.get("capabilities", {}).get("add"):
                errors.append(f"{where}: adds capabilities")
            seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {}))
            if seccomp.get("type") != "RuntimeDefault":
                errors.append(f"{where}: seccompProfile is not RuntimeDefault")
            for probe, url in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                if c.get(probe, {}).get("httpGet", {}).get("path") != url:
                    errors.append(f"{where}: {probe} is not GET {url}")
        args = pod["containers"][0].get("args", [])
        if o["kind"] == "Deployment" and component(o) == "controller":
            if "--leader-elect" not in args:
                errors.append(f"{name}: no --leader-elect")
            if not any(a.startswith("--prometheus-url=http") for a in args):
                errors.append(f"{name}: no --prometheus-url")
            # Agents advertise pod IPs: their certificates are checked against one fixed name.
            if any(a.startswith("--agent-tls-ca-file=") for a in args):
                server = [a.split("=", 1)[1] for a in args
                          if a.startswith("--agent-tls-server-name=")]
                if not server or not server[0]:
                    errors.append(f"{name}: --agent-tls-ca-file without --agent-tls-server-name")
        if o["kind"] == "DaemonSet" and component(o) == "agent":
            if pod.get("automountServiceAccountToken") is not False:
                errors.append(f"{name}: the agent pods mount a service-account token")
            if "--node-name=$(NODE_NAME)" not in args:
                errors.append(f"{name}: --node-name is not $(NODE_NAME)")
            env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                   for e in pod["containers"][0].get("env", [])}
            if env.get("NODE_NAME") != "spec.nodeName":
                errors.append(f"{name}: NODE_NAME is not the downward API's spec.nodeName")
            # The agent itself (no shell wrapper) advertises its pod IP; with TLS the controller
            # checks the certificate against --agent-tls-server-name instead.
            if pod["containers"][0].get("command") != ["hydra-agent"]:
                errors.append(f"{name}: command is not [hydra-agent]")
            if not any(a.startswith("--grpc-advertise-address=$(POD_IP):") for a in args):
                errors.append(f"{name}: --grpc-advertise-address is not $(POD_IP):<port>")
            if env.get("POD_IP") != "status.podIP":
                errors.append(f"{name}: POD_IP is not the downward API's status.podIP")
            limits = pod["containers"][0].get("resources", {}).get("limits", {})
            if "nvidia.com/gpu" not in limits:
                errors.append(f"{name}: no nvidia.com/gpu limit")

    policies = [p for p in kinds.get("NetworkPolicy", []) if component(p) == "agent"]
    if not policies:
        errors.append("no NetworkPolicy for the agents")
    for p in policies:
        for rule in p["spec"].get("ingress", []):
            ports = {str(x.get("port")) for x in rule.get("ports", [])}
            if "grpc" in ports or "9443" in ports:
                peers = rule.get("from", [])
                ok = peers and all(
                    set(x) == {"podSelector"} and
                    x["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component") ==
                    "controller" for x in peers)
                if not ok:
                    errors.append(f'NetworkPolicy/{p["metadata"]["name"]}: gRPC open to {peers}')

    for kind, key in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        for m in kinds.get(kind, []):
            # Agents and controller export `job` and `namespace` of MultiModelJobs.
            if not all(e.get("honorLabels") for e in m["spec"][key]):
                errors.append(f'{kind}/{m["metadata"]["name"]}: honorLabels is not true')

    summary = ", ".join(f"{len(v)} {k}" for k, v in sorted(kinds.items()))
    if errors:
        print(f"{path}: FAILED ({summary})")
        for e in errors:
            print("  " + e)
        sys.exit(1)
    print(f"{path}: ok ({summary})")


if __name__ == "__main__":
    main()
