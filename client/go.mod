module github.com/moat-sandbox/moat/client

go 1.26
