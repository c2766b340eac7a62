package envd

// The Connect services' Go code is generated from spec/ by protoc (Debian
// protobuf-compiler) with protoc-gen-go and protoc-gen-connect-go pinned in
// tools.mod, and committed.
//go:generate sh -c "protoc -I spec --plugin=protoc-gen-go=$(go tool -modfile=../../../tools.mod -n protoc-gen-go) --plugin=protoc-gen-connect-go=$(go tool -modfile=../../../tools.mod -n protoc-gen-connect-go) --go_out=. --go_opt=module=github.com/moat-sandbox/moat/internal/execd/envd --go_opt=Mprocess/process.proto=github.com/moat-sandbox/moat/internal/execd/envd/gen/process --go_opt=Mfilesystem/filesystem.proto=github.com/moat-sandbox/moat/internal/execd/envd/gen/filesystem --connect-go_out=. --connect-go_opt=module=github.com/moat-sandbox/moat/internal/execd/envd --connect-go_opt=Mprocess/process.proto=github.com/moat-sandbox/moat/internal/execd/envd/gen/process --connect-go_opt=Mfilesystem/filesystem.proto=github.com/moat-sandbox/moat/internal/execd/envd/gen/filesystem process/process.proto filesystem/filesystem.proto"
