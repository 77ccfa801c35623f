{{/* The chart's name. */}}
{{- define "episode-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name of the release's objects: the release name when it contains the chart's name. */}}
{{- define "episode-operator.fullname" -}}
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

{{/* Cluster-scoped objects carry the namespace too: two releases of one name in two namespaces. */}}
{{- define "episode-operator.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "episode-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "episode-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "episode-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "episode-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "episode-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "episode-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "episode-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "true" when a watched namespace is a pattern (kopf globs, or a "!" exclusion). */}}
{{- define "episode-operator.namespaceGlobs" -}}
{{- $globs := false }}
{{- range .Values.watchNamespaces }}
{{- if regexMatch "[*?!,]" . }}{{ $globs = true }}{{ end }}
{{- end }}
{{- $globs }}
{{- end }}

{{/* "true" when the namespaced rules need a ClusterRole: all namespaces, or globs. */}}
{{- define "episode-operator.clusterwide" -}}
{{- or (empty .Values.watchNamespaces) (eq (include "episode-operator.namespaceGlobs" .) "true") }}
{{- end }}

{{/* An image reference; an empty or null tag is the chart's appVersion. */}}
{{- define "episode-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "episode-operator.sandboxImage" -}}
{{- printf "%s:%s" .Values.sandboxImage.repository (default .Chart.AppVersion .Values.sandboxImage.tag) }}
{{- end }}

{{/* The namespace of in-cluster build Jobs: builds.namespace, else the release's. */}}
{{- define "episode-operator.buildNamespace" -}}
{{- .Values.builds.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* The namespaces that get a Role when the operator watches named namespaces: those, and the builds'. */}}
{{- define "episode-operator.roleNamespaces" -}}
{{- $namespaces := .Values.watchNamespaces -}}
{{- if .Values.builds.registry -}}
{{- $namespaces = append $namespaces (include "episode-operator.buildNamespace" .) -}}
{{- end -}}
{{- $namespaces | uniq | toJson -}}
{{- end -}}
