{{/* nats-server configuration of the bundled cluster (nats.yaml). */}}
{{- define "runnerscale.nats.conf" -}}
{{- $namespace := include "runnerscale.namespace" . }}
{{- $name := include "runnerscale.nats.name" . }}
{{- $n := .Values.nats -}}
server_name: $POD_NAME
pid_file: /var/run/nats/nats.pid
listen: 0.0.0.0:4222
http: 0.0.0.0:8222
max_payload: 1MB
lame_duck_duration: 30s
lame_duck_grace_period: 10s

{{ if eq $n.auth.method "users" -}}
{{ .Files.Get "files/nats-authorization.conf" | trim }}
{{- else -}}
authorization {
  token: $NATS_TOKEN
}
{{- end }}

jetstream {
  store_dir: /data
  max_memory_store: {{ $n.jetstream.maxMemoryStore }}
  max_file_store: {{ $n.jetstream.maxFileStore }}
}
{{- if gt (int $n.replicas) 1 }}

cluster {
  name: {{ $name }}
  listen: 0.0.0.0:6222
  routes: [
    {{- range $i := until (int $n.replicas) }}
    nats://{{ $name }}-{{ $i }}.{{ $name }}-headless.{{ $namespace }}.svc.{{ $n.clusterDomain }}:6222
    {{- end }}
  ]
  connect_retries: 120
}
{{- end }}
{{- end }}
