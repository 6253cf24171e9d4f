{{- define "arcwright.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "arcwright.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "arcwright.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "arcwright.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "arcwright.selectorLabels" -}}
app.kubernetes.io/name: {{ include "arcwright.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "arcwright.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "arcwright.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: arcwright
{{- end }}

{{- define "arcwright.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "arcwright.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The single list of granted rules (rbac/rules.yaml). */}}
{{- define "arcwright.rules" -}}
{{- .Files.Get "rbac/rules.yaml" | fromYaml | toJson }}
{{- end }}
