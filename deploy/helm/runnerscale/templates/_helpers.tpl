{{/*
Names. The full name is cut to 40 characters so that "<fullname>-listener-pod" and the pods'
generated names stay valid.
*/}}
{{- define "runnerscale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{- define "runnerscale.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "runnerscale.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "runnerscale.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "runnerscale.labels" -}}
helm.sh/chart: {{ include "runnerscale.chart" . }}
app.kubernetes.io/name: {{ include "runnerscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: runnerscale
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "scale-set"). */}}
{{- define "runnerscale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "runnerscale.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels of one component's objects: (dict "root" $ "component" "scale-set"). */}}
{{- define "runnerscale.componentLabels" -}}
{{ include "runnerscale.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* worker name → its key under .Values.workers */}}
{{- define "runnerscale.workers" -}}
scale-set: scaleSet
runner-set: runnerSet
runner: runner
listener-pod: listenerPod
{{- end }}

{{/* The chart's resources per worker, when neither workers.<worker>.resources nor resources is set. */}}
{{- define "runnerscale.defaultResources" -}}
scale-set:
  requests: {cpu: 100m, memory: 128Mi}
  limits: {cpu: "1", memory: 512Mi}
runner-set:
  requests: {cpu: 100m, memory: 128Mi}
  limits: {cpu: "1", memory: 512Mi}
runner:
  requests: {cpu: 100m, memory: 192Mi}
  limits: {cpu: "2", memory: 768Mi}
listener-pod:
  requests: {cpu: 50m, memory: 128Mi}
  limits: {cpu: "1", memory: 512Mi}
{{- end }}

{{- define "runnerscale.serviceAccountPrefix" -}}
{{- default (include "runnerscale.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/* (dict "root" $ "worker" "scale-set") */}}
{{- define "runnerscale.serviceAccountName" -}}
{{- printf "%s-%s" (include "runnerscale.serviceAccountPrefix" .root) .worker }}
{{- end }}

{{- define "runnerscale.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "runnerscale.listenerImage" -}}
{{- default (include "runnerscale.image" .) .Values.config.listenerImage }}
{{- end }}

{{/* ARC's level names: warn is runnerscale's warning. */}}
{{- define "runnerscale.logLevel" -}}
{{- $level := lower (toString .Values.flags.logLevel) }}
{{- if eq $level "warn" }}warning{{ else }}{{ $level }}{{ end }}
{{- end }}

{{/* The watched namespaces, comma-joined; empty: all. The controller namespace is always watched
when a list is given: AutoscalingListeners and listener pods live there. */}}
{{- define "runnerscale.watchNamespaces" -}}
{{- $list := list }}
{{- with .Values.flags.watchSingleNamespace }}{{ $list = append $list . }}{{ end }}
{{- range .Values.flags.watchNamespaces }}{{ $list = append $list . }}{{ end }}
{{- if $list }}
{{- $list = append $list (include "runnerscale.namespace" .) }}
{{- end }}
{{- $list | uniq | join "," }}
{{- end }}

{{/* A numeric port at the end of an address (":8080" → 8080). */}}
{{- define "runnerscale.port" -}}
{{- regexFind "[0-9]+$" (toString .) }}
{{- end }}

{{- define "runnerscale.metricsEnabled" -}}
{{- if and .Values.metrics .Values.metrics.controllerManagerAddr }}true{{ end }}
{{- end }}

{{/* NATS */}}
{{- define "runnerscale.nats.name" -}}
{{- printf "%s-nats" (include "runnerscale.fullname" .) }}
{{- end }}

{{- define "runnerscale.nats.url" -}}
{{- if .Values.nats.bundled }}
{{- printf "nats://%s.%s.svc:4222" (include "runnerscale.nats.name" .) (include "runnerscale.namespace" .) }}
{{- else }}
{{- .Values.nats.url }}
{{- end }}
{{- end }}

{{- define "runnerscale.nats.authSecret" -}}
{{- default (printf "%s-nats-auth" (include "runnerscale.fullname" .)) .Values.nats.auth.existingSecret }}
{{- end }}

{{/* The NATS users of method "users", one per component: shared/bus/permissions.py COMPONENTS. */}}
{{- define "runnerscale.nats.components" -}}
{{ list "listener" "runner-set" "scale-set" "runner" "listener-pod" "bus-setup" "observer" | toJson }}
{{- end }}

{{/* The nats-server variable holding a component's password (permissions.password_env_var). */}}
{{- define "runnerscale.nats.passwordVar" -}}
NATS_PASSWORD_{{ . | upper | replace "-" "_" }}
{{- end }}

{{/* Environment variables with the NATS credentials (workers and the bus-setup Job);
dict "root" . "component" <a name of runnerscale.nats.components>. */}}
{{- define "runnerscale.nats.authEnv" -}}
{{- with .root }}
{{- $auth := .Values.nats.auth }}
{{- $secret := include "runnerscale.nats.authSecret" . }}
{{- if eq $auth.method "users" }}
- name: RUNNERSCALE_NATS_USER
  value: {{ $.component }}
- name: RUNNERSCALE_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $.component }}
{{- if eq $.component "listener-pod" }}
{{- /* Listener pods connect as the listener's own user: the worker reads its password from the
mounted file (runnerscale.nats.listenerVolumes) and writes it into each listener's config Secret. */}}
- name: RUNNERSCALE_LISTENER_NATS_USER
  value: listener
- name: RUNNERSCALE_LISTENER_NATS_PASSWORD_FILE
  value: /etc/runnerscale/nats-listener/password
{{- end }}
{{- else if eq $auth.method "token" }}
- name: RUNNERSCALE_NATS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $auth.tokenKey }}
{{- else if eq $auth.method "userPassword" }}
- name: RUNNERSCALE_NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $auth.userKey }}
- name: RUNNERSCALE_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $auth.passwordKey }}
{{- else if eq $auth.method "creds" }}
- name: RUNNERSCALE_NATS_CREDS
  value: /etc/runnerscale/nats-auth/{{ $auth.credsKey }}
{{- end }}
{{- if .Values.nats.tls.caSecret }}
- name: RUNNERSCALE_NATS_TLS_CA
  value: /etc/runnerscale/nats-tls/{{ .Values.nats.tls.caKey }}
{{- end }}
{{- end }}
{{- end }}

{{- define "runnerscale.nats.volumeMounts" -}}
{{- if eq .Values.nats.auth.method "creds" }}
- name: nats-auth
  mountPath: /etc/runnerscale/nats-auth
  readOnly: true
{{- end }}
{{- if .Values.nats.tls.caSecret }}
- name: nats-tls
  mountPath: /etc/runnerscale/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* The listener user's password for the listener-pod worker (method "users"); dict "root" . "component" <worker>. */}}
{{- define "runnerscale.nats.listenerVolumeMounts" -}}
{{- if and (eq .root.Values.nats.auth.method "users") (eq .component "listener-pod") }}
- name: nats-listener
  mountPath: /etc/runnerscale/nats-listener
  readOnly: true
{{- end }}
{{- end }}

{{- define "runnerscale.nats.listenerVolumes" -}}
{{- if and (eq .root.Values.nats.auth.method "users") (eq .component "listener-pod") }}
- name: nats-listener
  secret:
    secretName: {{ include "runnerscale.nats.authSecret" .root }}
    defaultMode: 0400
    items:
      - key: listener
        path: password
{{- end }}
{{- end }}

{{- define "runnerscale.nats.volumes" -}}
{{- if eq .Values.nats.auth.method "creds" }}
- name: nats-auth
  secret:
    secretName: {{ include "runnerscale.nats.authSecret" . }}
    items:
      - key: {{ .Values.nats.auth.credsKey }}
        path: {{ .Values.nats.auth.credsKey }}
{{- end }}
{{- if .Values.nats.tls.caSecret }}
- name: nats-tls
  secret:
    secretName: {{ .Values.nats.tls.caSecret }}
    items:
      - key: {{ .Values.nats.tls.caKey }}
        path: {{ .Values.nats.tls.caKey }}
{{- end }}
{{- end }}

{{/*
Checks across values that the schema cannot express; included by config.yaml, which is always
rendered. Each message names the value to change.
*/}}
{{- define "runnerscale.validate" -}}
{{- $v := .Values }}
{{- if and (not $v.serviceAccount.create) (eq (toString $v.serviceAccount.name) "") }}
{{- fail "serviceAccount.name is required when serviceAccount.create is false: the workers use the accounts <name>-scale-set, <name>-runner-set, <name>-runner and <name>-listener-pod" }}
{{- end }}
{{- if eq (toString $v.serviceAccount.name) "default" }}
{{- fail "serviceAccount.name must not be \"default\": each worker needs its own ServiceAccount with its own RBAC" }}
{{- end }}
{{- if ne (lower (toString $v.flags.logFormat)) "json" }}
{{- fail (printf "flags.logFormat %q is not supported: runnerscale writes JSON lines only (set it to \"json\" or remove it)" (toString $v.flags.logFormat)) }}
{{- end }}
{{- if not (has (include "runnerscale.logLevel" .) (list "debug" "info" "warning" "error")) }}
{{- fail (printf "flags.logLevel %q: use debug, info, warn or error" (toString $v.flags.logLevel)) }}
{{- end }}
{{- if not (include "runnerscale.port" $v.flags.healthProbeBindAddress) }}
{{- fail "flags.healthProbeBindAddress must end with a numeric port (e.g. \":8081\"): runnerscale always serves /healthz and /readyz for the probes" }}
{{- end }}
{{- if include "runnerscale.metricsEnabled" . }}
{{- if not (include "runnerscale.port" $v.metrics.controllerManagerAddr) }}
{{- fail "metrics.controllerManagerAddr must end with a numeric port (e.g. \":8080\")" }}
{{- end }}
{{- if eq (include "runnerscale.port" $v.metrics.controllerManagerAddr) (include "runnerscale.port" $v.flags.healthProbeBindAddress) }}
{{- fail "metrics.controllerManagerAddr and flags.healthProbeBindAddress must use different ports" }}
{{- end }}
{{- end }}
{{- if ge (float64 $v.config.shutdownTimeout) (float64 $v.terminationGracePeriodSeconds) }}
{{- fail "config.shutdownTimeout must be below terminationGracePeriodSeconds: in-flight reconciles finish and leases are released before the kubelet kills the pod" }}
{{- end }}
{{- if $v.nats.bundled }}
{{- if $v.nats.url }}
{{- fail "nats.url is for an existing NATS cluster: set nats.bundled=false to use it, or leave it empty" }}
{{- end }}
{{- if not (has $v.nats.auth.method (list "users" "token")) }}
{{- fail "the bundled NATS cluster authenticates clients with a user per component or a token: nats.auth.method must be users or token (one user/password and .creds files are for an existing cluster, nats.bundled=false)" }}
{{- end }}
{{- if gt (int $v.bus.streamReplicas) (int $v.nats.replicas) }}
{{- fail (printf "bus.streamReplicas (%d) cannot exceed nats.replicas (%d): JetStream places each replica on another server" (int $v.bus.streamReplicas) (int $v.nats.replicas)) }}
{{- end }}
{{- else }}
{{- if not $v.nats.url }}
{{- fail "nats.url is required when nats.bundled is false (e.g. nats://nats.nats.svc:4222)" }}
{{- end }}
{{- if and (eq $v.nats.auth.method "users") (not $v.nats.auth.existingSecret) }}
{{- fail "nats.auth.method users on an existing NATS cluster needs nats.auth.existingSecret: a password per component (README \"Authentication and permissions\")" }}
{{- end }}
{{- if and (eq $v.nats.auth.method "creds") (not $v.nats.auth.existingSecret) }}
{{- fail "nats.auth.method creds needs nats.auth.existingSecret: a Secret holding the .creds file under nats.auth.credsKey" }}
{{- end }}
{{- if and (eq $v.nats.auth.method "userPassword") (not $v.nats.auth.existingSecret) (not (and $v.nats.auth.user $v.nats.auth.password)) }}
{{- fail "nats.auth.method userPassword needs nats.auth.user and nats.auth.password, or nats.auth.existingSecret" }}
{{- end }}
{{- if and (eq $v.nats.auth.method "token") (not $v.nats.auth.existingSecret) (not $v.nats.auth.token) }}
{{- fail "an existing NATS cluster needs its token: set nats.auth.token or nats.auth.existingSecret (or another nats.auth.method)" }}
{{- end }}
{{- end }}
{{- end }}
