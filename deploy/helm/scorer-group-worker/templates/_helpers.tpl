{{- define "sgw.name" -}}{{ .Release.Name }}{{- end -}}
{{- define "sgw.labels" -}}
app.kubernetes.io/name: scorer-group-worker
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "sgw.secretName" -}}{{ .Values.existingSecret | default (printf "%s-secrets" .Release.Name) }}{{- end -}}
{{/* The settings every container gets: the values' env, then every key of the Secret as a variable. */}}
{{- define "sgw.env" -}}
{{- range $name, $value := .Values.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}
{{- define "sgw.envFrom" -}}
{{- if or .Values.existingSecret .Values.secrets }}
envFrom:
  - secretRef:
      name: {{ include "sgw.secretName" . }}
{{- end }}
{{- end -}}
{{- define "sgw.tlsVolume" -}}
{{- if .Values.tlsSecret }}
volumes:
  - name: tls
    secret:
      secretName: {{ .Values.tlsSecret }}
{{- end }}
{{- end -}}
{{- define "sgw.tlsMount" -}}
{{- if .Values.tlsSecret }}
volumeMounts:
  - name: tls
    mountPath: /etc/scorer-group-worker/tls
    readOnly: true
{{- end }}
{{- end -}}
