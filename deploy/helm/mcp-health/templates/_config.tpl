{{/*
The mcp-health configuration: what follows from the chart's other values (listen addresses from
`ports`, the state store from `mode`, `state`, `redis` and `externalRedis`), with `.Values.config`
merged over it, so `config` wins everywhere (the OpenTelemetry Collector chart's rule). The
defaults of everything else are in values.yaml `config`, where `--set config.x=null` removes one.
*/}}
{{- define "mcp-health.baseConfig" -}}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 0.0.0.0:{{ .Values.ports.otlpGrpc }}
      http:
        endpoint: 0.0.0.0:{{ .Values.ports.otlpHttp }}
exporters:
  prometheus:
    endpoint: 0.0.0.0:{{ .Values.ports.metrics }}
extensions:
  health_check:
    endpoint: 0.0.0.0:{{ .Values.ports.health }}
{{- if eq .Values.mode "statefulset" }}
processors:
  mcp_health:
    # Behind the `loadbalancing` exporter a trace that began before this pod did may have its first
    # spans on another pod (or on this one before a restart): never judge it healthy.
    partial_before_start: true
storage:
  kind: redis
  endpoint: {{ include "mcp-health.redisEndpoint" . | quote }}
{{- else if .Values.state.enabled }}
storage:
  directory: {{ .Values.state.mountPath }}
{{- end }}
{{- end }}

{{/* The Redis URL. The password is never written here: it is `${env:MCP_HEALTH_REDIS_PASSWORD}`,
which mcp-health substitutes from the pod's environment (a secretKeyRef). */}}
{{- define "mcp-health.redisEndpoint" -}}
{{- $url := "" }}
{{- if .Values.redis.enabled }}
{{- $url = printf "redis://%s:6379/0" (include "mcp-health.redisName" .) }}
{{- else }}
{{- $url = required "mode statefulset needs a shared Redis: set externalRedis.url or redis.enabled=true" .Values.externalRedis.url }}
{{- end }}
{{- if include "mcp-health.redisSecret" . }}
{{- $parts := splitn "://" 2 $url }}
{{- printf "%s://:${env:MCP_HEALTH_REDIS_PASSWORD}@%s" $parts._0 $parts._1 }}
{{- else }}
{{- $url }}
{{- end }}
{{- end }}

{{- define "mcp-health.config" -}}
{{- $base := include "mcp-health.baseConfig" . | fromYaml }}
{{- $config := mustMergeOverwrite $base (deepCopy .Values.config) }}
{{- toYaml $config }}
{{- end }}
