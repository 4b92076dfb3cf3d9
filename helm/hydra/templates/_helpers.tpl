{{/* Names. */}}
{{- define "hydra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hydra.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* 52 characters leave room for "-controller" and a DaemonSet pod's 6-character suffix. */}}
{{- define "hydra.controller.fullname" -}}
{{- printf "%s-controller" (include "hydra.fullname" . | trunc 52 | trimSuffix "-") }}
{{- end }}

{{- define "hydra.agent.fullname" -}}
{{- printf "%s-agent" (include "hydra.fullname" . | trunc 52 | trimSuffix "-") }}
{{- end }}

{{- define "hydra.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "hydra.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hydra.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "hydra.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hydra.leaseName" -}}
{{- default (include "hydra.controller.fullname" .) .Values.controller.leaderElection.leaseName }}
{{- end }}

{{- define "hydra.checkpointClaim" -}}
{{- default (printf "%s-checkpoints" (include "hydra.fullname" .)) .Values.storage.checkpoints.existingClaim }}
{{- end }}

{{/* Labels. */}}
{{- define "hydra.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "hydra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hydra
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "hydra.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hydra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "hydra.agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hydra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "hydra.controller.labels" -}}
{{ include "hydra.labels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "hydra.agent.labels" -}}
{{ include "hydra.labels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "hydra.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Prometheus Operator objects render only where the cluster serves them. */}}
{{- define "hydra.monitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{- define "hydra.monitoring.namespace" -}}
{{- default .Release.Namespace .Values.monitoring.namespace }}
{{- end }}

{{/* TLS. "hydra.tls.source": generate, certManager or existingSecret; "" when TLS is off.
The values are checked here, so that every template that includes it refuses the same way. */}}
{{- define "hydra.tls.source" -}}
{{- $t := .Values.tls }}
{{- if $t.enabled }}
{{- if eq $t.source "existingSecret" }}
{{- if not (or $t.existingSecret (and $t.agentSecret $t.controllerSecret)) }}
{{- fail "tls.source=existingSecret needs tls.existingSecret, or both tls.agentSecret and tls.controllerSecret" }}
{{- end }}
{{- else }}
{{- if or $t.existingSecret $t.agentSecret $t.controllerSecret }}
{{- fail (printf "tls.existingSecret / tls.agentSecret / tls.controllerSecret are used only with tls.source=existingSecret (tls.source is %s): set tls.source=existingSecret to keep your own Secrets" $t.source) }}
{{- end }}
{{- if not (or (eq $t.clientIdentity "*") (regexMatch "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$" $t.clientIdentity)) }}
{{- fail (printf "tls.clientIdentity %q: with tls.source=%s it becomes the controller certificate's CN and DNS SAN, so it must be a lower-case DNS name (or *)" $t.clientIdentity $t.source) }}
{{- end }}
{{- if and (eq $t.source "certManager") (not (.Capabilities.APIVersions.Has "cert-manager.io/v1")) }}
{{- fail "tls.source=certManager: this cluster does not serve cert-manager.io/v1. Install cert-manager first, or choose tls.source=generate or existingSecret (helm template: pass --api-versions cert-manager.io/v1)" }}
{{- end }}
{{- end }}
{{- $t.source }}
{{- end }}
{{- end }}

{{/* Names of the Secrets the chart generates or cert-manager writes. */}}
{{- define "hydra.tls.caSecretName" -}}
{{- printf "%s-ca" (include "hydra.fullname" . | trunc 52 | trimSuffix "-") }}
{{- end }}
{{- define "hydra.tls.agentSecretName" -}}
{{- printf "%s-tls" (include "hydra.agent.fullname" .) }}
{{- end }}
{{- define "hydra.tls.controllerSecretName" -}}
{{- printf "%s-tls" (include "hydra.controller.fullname" .) }}
{{- end }}

{{/* TLS secrets of each component ("" when TLS is off). */}}
{{- define "hydra.tls.agentSecret" -}}
{{- $source := include "hydra.tls.source" . }}
{{- if eq $source "existingSecret" }}
{{- default .Values.tls.existingSecret .Values.tls.agentSecret }}
{{- else if $source }}
{{- include "hydra.tls.agentSecretName" . }}
{{- end }}
{{- end }}

{{- define "hydra.tls.controllerSecret" -}}
{{- $source := include "hydra.tls.source" . }}
{{- if eq $source "existingSecret" }}
{{- default .Values.tls.existingSecret .Values.tls.controllerSecret }}
{{- else if $source }}
{{- include "hydra.tls.controllerSecretName" . }}
{{- end }}
{{- end }}

{{/* The path of one PEM file in the mounted Secret: (list $ "cert" | "key" | "ca"). Generated
and cert-manager Secrets have the keys tls.crt, tls.key and ca.crt; existing ones tls.keys. */}}
{{- define "hydra.tls.file" -}}
{{- $root := index . 0 }}
{{- $keys := dict "cert" "tls.crt" "key" "tls.key" "ca" "ca.crt" }}
{{- if eq (include "hydra.tls.source" $root) "existingSecret" }}
{{- $keys = $root.Values.tls.keys }}
{{- end }}
{{- printf "%s/%s" $root.Values.tls.mountPath (index $keys (index . 1)) }}
{{- end }}

{{/* The Secret (tls.crt, tls.key) of the CA the controller signs job agent pods' certificates
with: jobAgents.caSecret, else the chart's own CA when it has one; "" for plaintext pods. */}}
{{- define "hydra.jobAgents.caSecret" -}}
{{- if .Values.jobAgents.enabled }}
{{- $source := include "hydra.tls.source" . }}
{{- if .Values.jobAgents.caSecret }}
{{- .Values.jobAgents.caSecret }}
{{- else if or (eq $source "generate") (and (eq $source "certManager") (not .Values.tls.certManager.issuerRef.name)) }}
{{- include "hydra.tls.caSecretName" . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The name every agent's TLS certificate is checked against (--agent-tls-server-name). */}}
{{- define "hydra.tls.serverName" -}}
{{- default (printf "hydra-agent.%s.svc" .Release.Namespace) .Values.tls.serverName }}
{{- end }}

{{/* The CN and DNS SAN of a generated or cert-manager controller certificate. */}}
{{- define "hydra.tls.clientName" -}}
{{- ternary "hydra-controller" .Values.tls.clientIdentity (eq .Values.tls.clientIdentity "*") }}
{{- end }}

{{/* tls.source=generate: the CA and the two certificates, as YAML
  {ca: {crt, key, notAfter}, agent: {crt, key, notAfter}, controller: {crt, key, notAfter}}
(PEM text; notAfter in RFC 3339). Computed once per render (kept in .Values, so that the
Secrets and the pods' checksum annotations agree) from the Secrets of the release when
`lookup` finds them: an upgrade keeps the CA and each certificate unless it has fewer than
tls.generate.renewDays days left, or (certificates) its name or its CA changed. `helm template`
and client-side dry-runs cannot look up, and render new ones every time. */}}
{{- define "hydra.tls.generated" -}}
{{- if not (hasKey .Values "hydraGeneratedTls") }}
{{- $g := .Values.tls.generate }}
{{- $ns := .Release.Namespace }}
{{- $fmt := "2006-01-02T15:04:05Z07:00" }}
{{- $now := now | unixEpoch | int64 }}
{{- $renewBy := add $now (mul (int64 $g.renewDays) 86400) }}
{{- $out := dict }}
{{- /* The CA. */}}
{{- $ca := dict }}
{{- $old := lookup "v1" "Secret" $ns (include "hydra.tls.caSecretName" .) }}
{{- $oldData := default dict (get $old "data") }}
{{- $oldNotAfter := get (default dict (get (default dict (get $old "metadata")) "annotations")) "hydra.dev/not-after" }}
{{- if and (get $oldData "tls.crt") (get $oldData "tls.key") $oldNotAfter (gt (toDate $fmt $oldNotAfter | unixEpoch | int64) $renewBy) }}
{{- $c := buildCustomCert (get $oldData "tls.crt") (get $oldData "tls.key") }}
{{- $ca = $c }}
{{- $_ := set $out "ca" (dict "crt" $c.Cert "key" $c.Key "notAfter" $oldNotAfter) }}
{{- else }}
{{- $ca = genCA "hydra-ca" (int $g.caDays) }}
{{- $_ := set $out "ca" (dict "crt" $ca.Cert "key" $ca.Key "notAfter" (dateInZone $fmt (add $now (mul (int64 $g.caDays) 86400)) "UTC")) }}
{{- end }}
{{- /* The agents' server certificate and the controller's client certificate. */}}
{{- $leaves := list
  (list "agent" (include "hydra.tls.agentSecretName" .) (include "hydra.tls.serverName" .))
  (list "controller" (include "hydra.tls.controllerSecretName" .) (include "hydra.tls.clientName" .)) }}
{{- range $leaves }}
{{- $key := index . 0 }}
{{- $name := index . 2 }}
{{- $old := lookup "v1" "Secret" $ns (index . 1) }}
{{- $oldData := default dict (get $old "data") }}
{{- $oldAnn := default dict (get (default dict (get $old "metadata")) "annotations") }}
{{- $oldNotAfter := get $oldAnn "hydra.dev/not-after" }}
{{- if and (get $oldData "tls.crt") (get $oldData "tls.key") (eq (b64dec (get $oldData "ca.crt")) $out.ca.crt) (eq (get $oldAnn "hydra.dev/name") $name) $oldNotAfter (gt (toDate $fmt $oldNotAfter | unixEpoch | int64) $renewBy) }}
{{- $_ := set $out $key (dict "crt" (b64dec (get $oldData "tls.crt")) "key" (b64dec (get $oldData "tls.key")) "notAfter" $oldNotAfter "name" $name) }}
{{- else }}
{{- $c := genSignedCert $name nil (list $name) (int $g.certDays) $ca }}
{{- $_ := set $out $key (dict "crt" $c.Cert "key" $c.Key "notAfter" (dateInZone $fmt (add $now (mul (int64 $g.certDays) 86400)) "UTC") "name" $name) }}
{{- end }}
{{- end }}
{{- $_ := set .Values "hydraGeneratedTls" $out }}
{{- end }}
{{- toYaml .Values.hydraGeneratedTls }}
{{- end }}

{{/* A checksum of one component's generated certificate ("agent" or "controller"), for a pod
annotation: the pods restart when an upgrade re-issues it, and only then. "" unless generated. */}}
{{- define "hydra.tls.checksum" -}}
{{- $root := index . 0 }}
{{- if eq (include "hydra.tls.source" $root) "generate" }}
{{- $g := fromYaml (include "hydra.tls.generated" $root) }}
{{- printf "%s%s" (index $g (index . 1)).crt $g.ca.crt | sha256sum }}
{{- end }}
{{- end }}

{{- define "hydra.pod.volumesTmp" -}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- end }}
