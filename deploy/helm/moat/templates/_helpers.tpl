{{- define "moat.name" -}}{{ .Release.Name }}-controller{{- end -}}
{{- define "moat.labels" -}}
app.kubernetes.io/name: moat
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}
{{- define "moat.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" .Chart.AppVersion) }}{{- end -}}
{{- define "moat.nodeLabels" -}}
app.kubernetes.io/name: moat
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end -}}
