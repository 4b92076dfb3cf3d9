#!/usr/bin/env python3
"""Checks the API server's dry-run output of one rendered chart (a kubectl List in JSON).

  check_rendered.py OUT.json [--expect KIND ...] [--tls generate|certManager|existingSecret|off]
      [--server-name NAME] [--client-identity ID] [--secrets AGENT CONTROLLER]
      [--scrape-job JOB]

Every container (and init container) of every workload runs as non-root with a read-only root
file system, no privilege escalation, all capabilities dropped and the RuntimeDefault seccomp
profile; the agents' NetworkPolicy admits gRPC only from the controller's pods; the agents get
no service-account token; ServiceMonitors and PodMonitors keep the targets' own labels
(honorLabels: both components export MultiModelJobs' `job` and `namespace`); the controller
runs with --leader-elect, and with --agent-tls-server-name wherever it has --agent-tls-ca-file;
the agent runs hydra-agent itself and advertises $(POD_IP); its node name comes from
spec.nodeName. --expect names kinds that must be present.

TLS (--tls, default generate): the agents' and the controller's flags for that mode (mutual
TLS with --tls-client-identity, or --insecure when off) and the Secrets their `tls` volumes
mount: generated ones are decoded and checked with openssl (SANs, CN, signed by the CA, key
matches, usages, the pods' checksum annotation); cert-manager Certificates write them;
existing ones are not rendered. Scrape job: the controller's --agent-scrape-job is
--scrape-job (default hydra-agent) and is the `job` the chart's agent ServiceMonitor or
PodMonitor gives the agents' series (its jobLabel's value on the agent Service or pods).
"""
import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile

WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--expect", nargs="*", default=[])
    ap.add_argument("--tls", choices=["generate", "certManager", "existingSecret", "off"],
                    default="generate")
    ap.add_argument("--server-name", default="hydra-agent.hydra-system.svc")
    ap.add_argument("--client-identity", default="hydra-controller")
    ap.add_argument("--secrets", nargs=2, metavar=("AGENT", "CONTROLLER"))
    ap.add_argument("--scrape-job", default="hydra-agent")
    ap.add_argument("--job-agents", default="chart-ca",
                    help="chart-ca (the chart's CA signs job agent pods' certificates), "
                         "plaintext (none does), off (no pods for spec.agents), or the name of "
                         "the CA Secret (jobAgents.caSecret)")
    ap.add_argument("--no-shared-pool", action="store_true",
                    help="controller.prometheusUrl is empty: no --prometheus-url")
    opts = ap.parse_args()
    path, expect = opts.path, opts.expect
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
            has_prometheus = any(a.startswith("--prometheus-url=http") for a in args)
            if has_prometheus == opts.no_shared_pool:
                errors.append(f"{name}: --prometheus-url " +
                              ("given without a shared pool" if has_prometheus else "missing"))
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

    errors += check_job_agents(kinds, opts)
    errors += check_tls(kinds, opts)
    errors += check_scrape_job(kinds, opts)

    summary = ", ".join(f"{len(v)} {k}" for k, v in sorted(kinds.items()))
    if errors:
        print(f"{path}: FAILED ({summary})")
        for e in errors:
            print("  " + e)
        sys.exit(1)
    print(f"{path}: ok ({summary}; tls {opts.tls}, scrape job {opts.scrape_job})")


def check_job_agents(kinds, opts):
    """The controller's RBAC and flags for the agent pods of jobs with spec.agents: it may
    create, list and delete pods (and, with a CA to sign their certificates, Secrets), and
    mounts the CA that --agent-pod-ca-cert-file names. Returns error strings."""
    errors = []
    roles = [r for r in kinds.get("ClusterRole", []) if component(r) == "controller"]
    verbs = {}
    for r in roles:
        for rule in r.get("rules", []):
            if "" in rule.get("apiGroups", []):
                for res in rule.get("resources", []):
                    verbs.setdefault(res, set()).update(rule.get("verbs", []))
    pods_ok = {"get", "list", "watch", "create", "delete"} <= verbs.get("pods", set())
    secrets_ok = {"get", "create", "update", "delete"} <= verbs.get("secrets", set())
    want_pods = opts.job_agents != "off"
    want_secrets = opts.job_agents not in ("off", "plaintext")
    if not roles:
        pass  # a listing without RBAC objects (a release's workloads and Secrets only)
    elif pods_ok != want_pods:
        errors.append(f"controller ClusterRole: pods {'not ' if want_pods else ''}granted "
                      f"(job agents {opts.job_agents}): {sorted(verbs.get('pods', []))}")
    if roles and (bool(verbs.get("secrets")) != want_secrets or
                  (want_secrets and not secrets_ok)):
        errors.append(f"controller ClusterRole: secrets {sorted(verbs.get('secrets', []))} "
                      f"(job agents {opts.job_agents})")
    dep = workload(kinds, "Deployment", "controller")
    if dep is None:
        return errors + ["no controller Deployment"]
    pod = dep["spec"]["template"]["spec"]
    f = flags(pod["containers"][0].get("args", []))
    if ("--agent-pod-grpc-port" in f) != want_pods:
        errors.append(f"controller: --agent-pod-grpc-port with job agents {opts.job_agents}")
    ca_flags = f.get("--agent-pod-ca-cert-file", []) + f.get("--agent-pod-ca-key-file", [])
    ca_secret = next((v.get("secret", {}).get("secretName") for v in pod.get("volumes", [])
                      if v["name"] == "agent-ca"), None)
    if not want_secrets:
        if ca_flags or ca_secret:
            errors.append(f"controller: a job agents' CA ({ca_secret}) with {opts.job_agents}")
        return errors
    if ca_flags != ["/etc/hydra/agent-ca/tls.crt", "/etc/hydra/agent-ca/tls.key"]:
        errors.append(f"controller: --agent-pod-ca-cert/key-file are {ca_flags}")
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0].get("volumeMounts", [])}
    if mounts.get("agent-ca") != "/etc/hydra/agent-ca":
        errors.append("controller: the job agents' CA is not mounted at /etc/hydra/agent-ca")
    expected = None if opts.job_agents == "chart-ca" else opts.job_agents
    if ca_secret is None or (expected and ca_secret != expected) or \
            (not expected and not ca_secret.endswith("-ca")):
        errors.append(f"controller: the job agents' CA Secret is {ca_secret}")
    return errors


def component(o):
    return o["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")


def workload(kinds, kind, comp):
    found = [o for o in kinds.get(kind, []) if component(o) == comp]
    return found[0] if len(found) == 1 else None


def flags(args):
    """--name=value flags as {name: [values]} (a bare --name has the value None)."""
    out = {}
    for a in args:
        name, _, value = a.partition("=")
        out.setdefault(name, []).append(value if _ else None)
    return out


def tls_mount(pod):
    """(mount path, Secret name) of the container's `tls` volume, or (None, None)."""
    c = pod["containers"][0]
    path = next((m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] == "tls"), None)
    secret = next((v.get("secret", {}).get("secretName") for v in pod.get("volumes", [])
                   if v["name"] == "tls"), None)
    return path, secret


def openssl(*args, stdin=None):
    r = subprocess.run(["openssl", *args], input=stdin, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def check_generated_secret(secret, role, files, name, ca_pem, pod_annotations):
    """One generated Secret: its keys are the files the flags name, and its certificate is
    what `role` needs. Returns error strings."""
    errors = []
    where = f'Secret/{secret["metadata"]["name"]}'
    data = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
    for f in files:
        if os.path.basename(f) not in data:
            errors.append(f"{where}: no key {os.path.basename(f)} (flag file {f})")
    if errors:
        return errors
    crt, key, ca = data["tls.crt"], data["tls.key"], data["ca.crt"]
    if ca != ca_pem:
        errors.append(f"{where}: ca.crt is not the CA Secret's certificate")
    rc, text = openssl("x509", "-noout", "-text", stdin=crt)
    if rc != 0:
        return errors + [f"{where}: tls.crt is not a PEM certificate: {text.strip()}"]
    san = ""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "X509v3 Subject Alternative Name" in line:
            san = lines[i + 1].strip()
    if [s.strip() for s in san.split(",")] != [f"DNS:{name}"]:
        errors.append(f"{where}: SAN is {san!r}, not DNS:{name}")
    rc, subject = openssl("x509", "-noout", "-subject", "-nameopt", "RFC2253", stdin=crt)
    if subject.strip() != f"subject=CN={name}":
        errors.append(f"{where}: {subject.strip()}, not CN={name}")
    usage = "TLS Web Server Authentication" if role == "agent" else "TLS Web Client Authentication"
    if usage not in text:
        errors.append(f"{where}: no extended key usage {usage}")
    if "CA:TRUE" in text:
        errors.append(f"{where}: the certificate is a CA")
    with tempfile.TemporaryDirectory() as d:
        for n, pem in (("ca.crt", ca), ("tls.crt", crt)):
            with open(os.path.join(d, n), "w") as f:
                f.write(pem)
        rc, out = openssl("verify", "-x509_strict", "-purpose",
                          "sslserver" if role == "agent" else "sslclient",
                          "-CAfile", os.path.join(d, "ca.crt"), os.path.join(d, "tls.crt"))
        if rc != 0:
            errors.append(f"{where}: openssl verify against ca.crt: {out.strip()}")
    _, pub_crt = openssl("x509", "-noout", "-pubkey", stdin=crt)
    rc, pub_key = openssl("pkey", "-pubout", stdin=key)
    if rc != 0 or pub_crt != pub_key:
        errors.append(f"{where}: tls.key is not the key of tls.crt")
    want = hashlib.sha256((crt + ca).encode()).hexdigest()
    if pod_annotations.get("hydra.dev/tls-checksum") != want:
        errors.append(f"{where}: the {role} pods' hydra.dev/tls-checksum is not its checksum")
    return errors


def check_tls(kinds, opts):
    errors = []
    agent = workload(kinds, "DaemonSet", "agent")
    controller = workload(kinds, "Deployment", "controller")
    if agent is None or controller is None:
        return ["TLS: not exactly one agent DaemonSet and one controller Deployment"]
    apod, cpod = agent["spec"]["template"]["spec"], controller["spec"]["template"]["spec"]
    af, cf = flags(apod["containers"][0].get("args", [])), flags(cpod["containers"][0].get("args", []))
    secrets = {o["metadata"]["name"]: o for o in kinds.get("Secret", [])}
    certificates = kinds.get("Certificate", [])

    if opts.tls == "off":
        if "--insecure" not in af:
            errors.append("tls off: the agents have no --insecure")
        errors += [f"tls off: the agents have {n}" for n in af if n.startswith("--tls-")]
        errors += [f"tls off: the controller has {n}" for n in cf if n.startswith("--agent-tls-")]
        for kind in ("Secret", "Certificate"):
            if kinds.get(kind):
                errors.append(f"tls off: {kind} objects rendered")
        for pod, who in ((apod, "agent"), (cpod, "controller")):
            if tls_mount(pod) != (None, None):
                errors.append(f"tls off: the {who} pods mount a tls volume")
        return errors

    if "--insecure" in af:
        errors.append("TLS on, yet the agents have --insecure")
    apath, asecret = tls_mount(apod)
    cpath, csecret = tls_mount(cpod)
    if not asecret or not csecret or not apath or not cpath:
        return errors + ["TLS on, yet a component has no tls Secret volume and mount"]
    want_a = {"--tls-cert-file", "--tls-key-file", "--tls-client-ca-file", "--tls-client-identity"}
    want_c = {"--agent-tls-ca-file", "--agent-tls-cert-file", "--agent-tls-key-file",
              "--agent-tls-server-name"}
    for name in sorted(want_a):
        if len(af.get(name, [])) != 1:
            errors.append(f"agents: {name} is not given once (mutual TLS)")
    for name in sorted(want_c):
        if len(cf.get(name, [])) != 1:
            errors.append(f"controller: {name} is not given once (mutual TLS)")
    if errors:
        return errors
    if af["--tls-client-identity"] != [opts.client_identity]:
        errors.append(f'agents: --tls-client-identity={af["--tls-client-identity"][0]}, '
                      f"not {opts.client_identity}")
    if cf["--agent-tls-server-name"] != [opts.server_name]:
        errors.append(f'controller: --agent-tls-server-name={cf["--agent-tls-server-name"][0]}, '
                      f"not {opts.server_name}")
    afiles = [af[n][0] for n in ("--tls-cert-file", "--tls-key-file", "--tls-client-ca-file")]
    cfiles = [cf[n][0] for n in ("--agent-tls-cert-file", "--agent-tls-key-file",
                                 "--agent-tls-ca-file")]
    for files, path, who in ((afiles, apath, "agents"), (cfiles, cpath, "controller")):
        for f in files:
            if os.path.dirname(f) != path.rstrip("/"):
                errors.append(f"{who}: {f} is not in the tls mount {path}")
    if opts.secrets and [asecret, csecret] != opts.secrets:
        errors.append(f"tls Secrets mounted are {asecret}, {csecret}, not {opts.secrets}")
    if asecret == csecret and opts.tls != "existingSecret":
        errors.append(f"agents and controller mount the same Secret {asecret}")
    # The certificates' names: a client identity of * makes the controller's certificate name
    # hydra-controller.
    client_name = "hydra-controller" if opts.client_identity == "*" else opts.client_identity

    if opts.tls == "generate":
        if certificates:
            errors.append("tls generate: Certificate objects rendered")
        if asecret not in secrets or csecret not in secrets:
            return errors + [f"tls generate: Secret {asecret} or {csecret} not rendered"]
        others = [s for n, s in secrets.items() if n not in (asecret, csecret)]
        agent_ca = base64.b64decode(secrets[asecret]["data"].get("ca.crt", "")).decode()
        ca_secrets = [s for s in others
                      if base64.b64decode(s.get("data", {}).get("tls.crt", "")).decode() == agent_ca]
        if len(ca_secrets) != 1 or len(secrets) != 3:
            return errors + [f"tls generate: expected one CA Secret beside {asecret} and "
                             f"{csecret}, found {sorted(secrets)}"]
        ca = ca_secrets[0]
        rc, text = openssl("x509", "-noout", "-text", stdin=agent_ca)
        if rc != 0 or "CA:TRUE" not in text:
            errors.append(f'Secret/{ca["metadata"]["name"]}: tls.crt is not a CA certificate')
        _, pub_crt = openssl("x509", "-noout", "-pubkey", stdin=agent_ca)
        rc, pub_key = openssl("pkey", "-pubout",
                              stdin=base64.b64decode(ca["data"].get("tls.key", "")).decode())
        if rc != 0 or pub_crt != pub_key:
            errors.append(f'Secret/{ca["metadata"]["name"]}: tls.key is not the CA\'s key')
        ca_name = ca["metadata"]["name"]
        if ca_name in {v.get("secret", {}).get("secretName") for v in apod.get("volumes", [])}:
            errors.append("the CA Secret (with the CA's key) is mounted by the agents' pods")
        # Only the controller, and only to sign job agent pods' certificates (job agents on
        # the chart's CA), mounts it: as volume agent-ca.
        mounted_as = {v["name"] for v in cpod.get("volumes", [])
                      if v.get("secret", {}).get("secretName") == ca_name}
        allowed = {"agent-ca"} if opts.job_agents == "chart-ca" else set()
        if not mounted_as <= allowed:
            errors.append(f"the CA Secret (with the CA's key) is mounted by the controller as "
                          f"{sorted(mounted_as)} (job agents {opts.job_agents})")
        errors += check_generated_secret(
            secrets[asecret], "agent", afiles, opts.server_name, agent_ca,
            agent["spec"]["template"]["metadata"].get("annotations", {}))
        errors += check_generated_secret(
            secrets[csecret], "controller", cfiles, client_name, agent_ca,
            controller["spec"]["template"]["metadata"].get("annotations", {}))
    elif opts.tls == "certManager":
        if secrets:
            errors.append(f"tls certManager: Secrets rendered ({sorted(secrets)})")
        by_secret = {c["spec"]["secretName"]: c for c in certificates}
        issuers = {(o["kind"], o["metadata"]["name"]) for k in ("Issuer", "ClusterIssuer")
                   for o in kinds.get(k, [])}
        for secret, role, name, usage in ((asecret, "agent", opts.server_name, "server auth"),
                                          (csecret, "controller", client_name, "client auth")):
            c = by_secret.get(secret)
            if c is None:
                errors.append(f"tls certManager: no Certificate writes Secret {secret}")
                continue
            where = f'Certificate/{c["metadata"]["name"]}'
            spec = c["spec"]
            if spec.get("dnsNames") != [name] or spec.get("commonName") != name:
                errors.append(f"{where}: dnsNames {spec.get('dnsNames')} / commonName "
                              f"{spec.get('commonName')}, not {name}")
            if usage not in spec.get("usages", []) or spec.get("isCA"):
                errors.append(f"{where}: usages {spec.get('usages')} lack {usage}")
            ref = spec.get("issuerRef", {})
            if ref.get("group", "cert-manager.io") == "cert-manager.io" and issuers and \
                    (ref.get("kind", "Issuer"), ref.get("name")) not in issuers:
                errors.append(f"{where}: issuerRef {ref} names no rendered issuer")
        # A bootstrapped CA: a selfSigned Issuer signs the CA Certificate, a CA Issuer its Secret.
        if issuers:
            cas = [c for c in certificates if c["spec"].get("isCA")]
            ca_issuers = [o for o in kinds.get("Issuer", []) if "ca" in o["spec"]]
            if len(cas) != 1 or len(ca_issuers) != 1 or \
                    ca_issuers[0]["spec"]["ca"]["secretName"] != cas[0]["spec"]["secretName"]:
                errors.append("tls certManager: the bootstrapped CA Certificate and CA Issuer "
                              "do not match")
    elif opts.tls == "existingSecret":
        for kind in ("Secret", "Certificate"):
            if kinds.get(kind):
                errors.append(f"tls existingSecret: {kind} objects rendered")
    return errors


def check_scrape_job(kinds, opts):
    """The controller's --agent-scrape-job is the job label the chart's monitor gives the
    agents' series: the Prometheus Operator names a ServiceMonitor's job after the Service's
    label jobLabel names (else the Service's name), a PodMonitor's after the pod's label (else
    <namespace>/<PodMonitor name>)."""
    errors = []
    controller = workload(kinds, "Deployment", "controller")
    if controller is None:
        return ["scrape job: no controller Deployment"]
    cf = flags(controller["spec"]["template"]["spec"]["containers"][0].get("args", []))
    job = cf.get("--agent-scrape-job", [])
    if job != [opts.scrape_job]:
        errors.append(f"controller: --agent-scrape-job is {job}, not [{opts.scrape_job!r}]")
    for m in kinds.get("ServiceMonitor", []) + kinds.get("PodMonitor", []):
        if component(m) != "agent":
            continue
        where = f'{m["kind"]}/{m["metadata"]["name"]}'
        key = m["spec"].get("jobLabel")
        if m["kind"] == "ServiceMonitor":
            sel = m["spec"]["selector"].get("matchLabels", {})
            targets = [(f'Service/{s["metadata"]["name"]}', s["metadata"].get("labels", {}))
                       for s in kinds.get("Service", [])
                       if all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        else:
            sel = m["spec"]["selector"].get("matchLabels", {})
            targets = [(f'DaemonSet/{d["metadata"]["name"]} pods',
                        d["spec"]["template"]["metadata"].get("labels", {}))
                       for d in kinds.get("DaemonSet", [])
                       if all(d["spec"]["template"]["metadata"].get("labels", {}).get(k) == v
                              for k, v in sel.items())]
        if not targets:
            errors.append(f"{where}: selects nothing rendered")
        for name, labels in targets:
            got = labels.get(key) if key else None
            if not got:  # the Prometheus Operator's default
                got = name.split("/", 1)[1] if m["kind"] == "ServiceMonitor" else \
                    f'{m["metadata"]["namespace"]}/{m["metadata"]["name"]}'
            if got != opts.scrape_job:
                errors.append(f"{where}: the agents' series get job={got!r} ({name}), but the "
                              f"controller reads --agent-scrape-job={opts.scrape_job}")
    return errors


if __name__ == "__main__":
    main()
