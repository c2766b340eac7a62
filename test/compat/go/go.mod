module github.com/moat-sandbox/moat/test/compat/go

go 1.26

require github.com/alibaba/OpenSandbox/sdks/sandbox/go v1.2.0

require golang.org/x/sync v0.7.0 // indirect
