module github.com/dpnode/dpnode

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	go.uber.org/goleak v1.3.0
	google.golang.org/protobuf v1.36.12
	pgregory.net/rapid v1.3.0
)

require github.com/google/uuid v1.6.0 // indirect
