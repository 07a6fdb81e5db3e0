{{/* Names and labels shared by every object. */}}
{{- define "gd2fs.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gd2fs.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "gd2fs.tag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component (master or server) */}}
{{- define "gd2fs.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gd2fs.tag" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion | toString -}}
{{- if or (eq $tag "latest") (hasSuffix ":latest" $tag) -}}
{{- fail "image.tag latest is refused: pin the version (gd2fs --version) so masters are upgraded before servers" -}}
{{- end -}}
{{- $tag -}}
{{- end -}}

{{- define "gd2fs.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "gd2fs.tag" .) -}}
{{- end -}}

{{/* The servers' image: servers.imageTag during a two-step upgrade (masters first), else the masters'. */}}
{{- define "gd2fs.serverImage" -}}
{{- $tag := .Values.servers.imageTag | default (include "gd2fs.tag" .) | toString -}}
{{- if or (eq $tag "latest") (hasSuffix ":latest" $tag) -}}
{{- fail "servers.imageTag latest is refused: pin the version" -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{- define "gd2fs.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end -}}
{{- end -}}

{{/* The URL servers and in-cluster clients give as --master. */}}
{{- define "gd2fs.masterURL" -}}
{{- printf "%s://%s-master.%s.svc:%d" (include "gd2fs.scheme" .) (include "gd2fs.fullname" .) .Release.Namespace (int .Values.masters.port) -}}
{{- end -}}

{{- define "gd2fs.sqlite" -}}
{{- if .Values.masters.postgres.secretName }}false{{ else }}true{{ end -}}
{{- end -}}

{{/* Environment shared by masters and servers: token and TLS files. */}}
{{- define "gd2fs.commonEnv" -}}
{{- if .Values.token.secretName }}
- name: GD2FS_TOKEN_FILE
  value: /etc/gd2fs/token/{{ .Values.token.key }}
{{- end }}
{{- if .Values.tls.enabled }}
- name: GD2FS_TLS_CERT
  value: /etc/gd2fs/tls/tls.crt
- name: GD2FS_TLS_KEY
  value: /etc/gd2fs/tls/tls.key
- name: GD2FS_TLS_CA
  value: /etc/gd2fs/tls/ca.crt
{{- end }}
{{- end -}}

{{- define "gd2fs.commonMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.token.secretName }}
- name: token
  mountPath: /etc/gd2fs/token
  readOnly: true
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/gd2fs/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "gd2fs.commonVolumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.token.secretName }}
- name: token
  secret:
    secretName: {{ .Values.token.secretName }}
    defaultMode: 0400
    items:
      - key: {{ .Values.token.key }}
        path: {{ .Values.token.key }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- if not .Values.tls.secretName }}
{{- fail "tls.enabled needs tls.secretName: a Secret with tls.crt, tls.key and ca.crt" }}
{{- end }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
    defaultMode: 0400
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
      - {key: ca.crt, path: ca.crt}
{{- end }}
{{- end -}}

{{/* Probes on the real health endpoints; TCP under mutual TLS (kubelet has no client certificate). */}}
{{- define "gd2fs.probes" -}}
{{- if .root.Values.tls.verifyClients }}
readinessProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 5
livenessProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 10
  failureThreshold: 6
{{- else }}
startupProbe:
  httpGet: {path: /healthz, port: {{ .port }}, scheme: {{ include "gd2fs.scheme" .root | upper }}}
  periodSeconds: 2
  failureThreshold: 60
readinessProbe:
  httpGet: {path: /readyz, port: {{ .port }}, scheme: {{ include "gd2fs.scheme" .root | upper }}}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
livenessProbe:
  # Liveness only asks that the process answers HTTP: a server cut off from
  # its master, or a master from its database, is not cured by a restart.
  # Generous: a server at --max-conns may be slow to accept the probe.
  httpGet: {path: /healthz, port: {{ .port }}, scheme: {{ include "gd2fs.scheme" .root | upper }}}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- end }}
{{- end -}}

{{- define "gd2fs.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "gd2fs.podSecurityContext" -}}
fsGroup: 65532
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gd2fs.metricsAnnotations" -}}
{{- if .root.Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
prometheus.io/scheme: {{ include "gd2fs.scheme" .root }}
{{- end }}
{{- end -}}

{{- define "gd2fs.antiAffinity" -}}
podAntiAffinity:
{{- if eq .mode "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "gd2fs.selector" . | nindent 10 }}
{{- else if eq .mode "soft" }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "gd2fs.selector" . | nindent 12 }}
{{- else }}
{{- fail (printf "antiAffinity %q: write hard or soft" .mode) }}
{{- end }}
{{- end -}}

{{- define "gd2fs.masterReplicas" -}}
{{- if .Values.masters.replicas -}}
{{- int .Values.masters.replicas -}}
{{- else if eq (include "gd2fs.sqlite" .) "true" -}}
1
{{- else -}}
2
{{- end -}}
{{- end -}}
