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

{{/* TLS secrets of each component ("" when TLS is off). */}}
{{- define "hydra.tls.agentSecret" -}}
{{- if .Values.tls.enabled }}
{{- $s := default .Values.tls.existingSecret .Values.tls.agentSecret }}
{{- required "tls.enabled needs tls.existingSecret or tls.agentSecret" $s }}
{{- end }}
{{- end }}

{{- define "hydra.tls.controllerSecret" -}}
{{- if .Values.tls.enabled }}
{{- $s := default .Values.tls.existingSecret .Values.tls.controllerSecret }}
{{- required "tls.enabled needs tls.existingSecret or tls.controllerSecret" $s }}
{{- end }}
{{- end }}

{{/* The name every agent's TLS certificate is checked against (--agent-tls-server-name). */}}
{{- define "hydra.tls.serverName" -}}
{{- default (printf "hydra-agent.%s.svc" .Release.Namespace) .Values.tls.serverName }}
{{- end }}

{{- define "hydra.pod.volumesTmp" -}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- end }}
