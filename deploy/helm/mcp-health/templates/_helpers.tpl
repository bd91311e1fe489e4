{{/* Names and labels, as the OpenTelemetry Collector chart spells them. */}}
{{- define "mcp-health.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mcp-health.fullname" -}}
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

{{- define "mcp-health.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mcp-health.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mcp-health.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end }}

{{- define "mcp-health.labels" -}}
helm.sh/chart: {{ include "mcp-health.chart" . }}
{{ include "mcp-health.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "mcp-health.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mcp-health.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "mcp-health.redisName" -}}
{{- printf "%s-redis" (include "mcp-health.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret holding the Redis password (in-chart Redis or external): never the ConfigMap. */}}
{{- define "mcp-health.redisSecret" -}}
{{- if .Values.redis.enabled }}{{ .Values.redis.auth.existingSecret }}{{ else }}{{ .Values.externalRedis.existingSecret }}{{ end }}
{{- end }}

{{- define "mcp-health.redisPasswordKey" -}}
{{- if .Values.redis.enabled }}{{ .Values.redis.auth.passwordKey }}{{ else }}{{ .Values.externalRedis.passwordKey }}{{ end }}
{{- end }}

{{- define "mcp-health.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
