{{/* The pod, one definition for both modes. */}}
{{- define "mcp-health.pod" -}}
metadata:
  annotations:
    # A config change changes this hash, so `helm upgrade` rolls the pods (mcp-health reads most
    # settings at start only; a SIGHUP reload would not apply them).
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  labels:
    {{- include "mcp-health.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "mcp-health.serviceAccountName" . }}
  # mcp-health never talks to the Kubernetes API.
  automountServiceAccountToken: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  # Longer than config.service.telemetry.shutdown_timeout: SIGTERM drains (in-flight calls decided,
  # exports flushed) before the kubelet's SIGKILL.
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  containers:
    - name: mcp-health
      image: {{ include "mcp-health.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - serve
        - --config
        - /etc/mcp-health/mcp-health.yaml
        {{- range .Values.command.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      {{- $secret := include "mcp-health.redisSecret" . }}
      {{- if or .Values.extraEnvs (and (eq .Values.mode "statefulset") $secret) }}
      env:
        {{- if and (eq .Values.mode "statefulset") $secret }}
        # Substituted into storage.endpoint by mcp-health (${env:…}); never in the ConfigMap.
        - name: MCP_HEALTH_REDIS_PASSWORD
          valueFrom:
            secretKeyRef:
              name: {{ $secret }}
              key: {{ include "mcp-health.redisPasswordKey" . }}
        {{- end }}
        {{- with .Values.extraEnvs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      {{- with .Values.extraEnvsFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - {name: otlp-grpc, containerPort: {{ .Values.ports.otlpGrpc }}, protocol: TCP}
        - {name: otlp-http, containerPort: {{ .Values.ports.otlpHttp }}, protocol: TCP}
        - {name: metrics, containerPort: {{ .Values.ports.metrics }}, protocol: TCP}
        - {name: health, containerPort: {{ .Values.ports.health }}, protocol: TCP}
      # The health check answers 200 while serving (also "degraded: state store unavailable": a
      # Redis outage must not restart every pod) and 503 while draining.
      livenessProbe:
        httpGet: {path: /, port: health}
        {{- toYaml .Values.livenessProbe | nindent 8 }}
      readinessProbe:
        httpGet: {path: /, port: health}
        {{- toYaml .Values.readinessProbe | nindent 8 }}
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: /etc/mcp-health
          readOnly: true
        {{- if and (eq .Values.mode "deployment") .Values.state.enabled }}
        - name: state
          mountPath: {{ .Values.state.mountPath }}
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "mcp-health.fullname" . }}
    {{- if and (eq .Values.mode "deployment") .Values.state.enabled }}
    # The root filesystem is read-only: storage.directory (state.redb, the journal, the on-disk
    # sending queue) is the one writable place mcp-health needs.
    - name: state
      {{- if .Values.state.existingClaim }}
      persistentVolumeClaim:
        claimName: {{ .Values.state.existingClaim }}
      {{- else }}
      emptyDir:
        {{- toYaml .Values.state.emptyDir | nindent 8 }}
      {{- end }}
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
