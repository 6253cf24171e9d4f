{{- define "scaleSet.name" -}}
{{- default .Release.Name .Values.runnerScaleSetName | trunc 45 | trimSuffix "-" }}
{{- end }}

{{- define "scaleSet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "scaleSet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: arcwright
app.kubernetes.io/component: runner-scale-set
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The Secret the scale set reads: an existing one by name, or ours. */}}
{{- define "scaleSet.secretName" -}}
{{- if kindIs "string" .Values.githubConfigSecret }}
{{- .Values.githubConfigSecret }}
{{- else }}
{{- printf "%s-github-secret" (include "scaleSet.name" .) }}
{{- end }}
{{- end }}

{{- define "scaleSet.policyConfigMapName" -}}
{{- default (printf "%s-policy" .Release.Name) .Values.policyConfigMap.name }}
{{- end }}
