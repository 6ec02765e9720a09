package gpu

import (
	"bytes"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// captureLogger returns a logger writing text records into the returned
// buffer, so tests can assert on exactly what an operator would see.
func captureLogger() (*slog.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	return slog.New(slog.NewTextHandler(&buf, nil)), &buf
}

func logLines(buf *bytes.Buffer) []string {
	s := strings.TrimRight(buf.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// countShutdowns wraps the server's Shutdown so tests can check that NVML
// is released on every path that initialised it.
func countShutdowns(s *server.Server) *int {
	n := new(int)
	s.ShutdownFunc = func() nvml.Return {
		*n++
		return nvml.SUCCESS
	}
	return n
}

func TestDiscoverDGXH200(t *testing.T) {
	srv := dgxh200.New()
	shutdowns := countShutdowns(srv)
	log, buf := captureLogger()

	inv, err := Discover(Config{NVML: srv, VirtualCount: 3, Logger: log})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if inv.Source != SourceNVML {
		t.Errorf("Source = %q, want %q", inv.Source, SourceNVML)
	}
	if inv.DriverVersion != "550.54.15" {
		t.Errorf("DriverVersion = %q, want 550.54.15", inv.DriverVersion)
	}
	if got := len(inv.Devices); got != 8 {
		t.Fatalf("found %d devices, want 8 (VirtualCount must be ignored when NVML works)", got)
	}
	wantMem := gpus.H200_SXM5_141GB.MemoryMB << 20
	seen := map[string]bool{}
	for i, d := range inv.Devices {
		mockDev := srv.Devices[i].(*server.Device)
		if d.Index != i {
			t.Errorf("device %d: Index = %d", i, d.Index)
		}
		if d.UUID != mockDev.UUID || !strings.HasPrefix(d.UUID, "GPU-") {
			t.Errorf("device %d: UUID = %q, want %q", i, d.UUID, mockDev.UUID)
		}
		if seen[d.UUID] {
			t.Errorf("device %d: duplicate UUID %q", i, d.UUID)
		}
		seen[d.UUID] = true
		if !strings.Contains(d.Name, "H200") {
			t.Errorf("device %d: Name = %q, want an H200", i, d.Name)
		}
		if d.MemoryTotalBytes != wantMem || d.MemoryTotalBytes < 140<<30 {
			t.Errorf("device %d: MemoryTotalBytes = %d, want %d (~141 GiB)", i, d.MemoryTotalBytes, wantMem)
		}
		if d.Virtual {
			t.Errorf("device %d: Virtual = true for an NVML device", i)
		}
	}
	if *shutdowns != 1 {
		t.Errorf("Shutdown called %d times, want 1", *shutdowns)
	}
	if lines := logLines(buf); len(lines) != 0 {
		t.Errorf("unexpected log output on the happy path: %q", lines)
	}
}

func TestDiscoverReportsFreeMemory(t *testing.T) {
	srv := dgxh200.NewWithGPUs(gpus.H200_SXM5_141GB)
	dev := srv.Devices[0].(*server.Device)
	dev.MemoryInfo = nvml.Memory{Total: 100, Free: 60, Used: 40}

	inv, err := Discover(Config{NVML: srv})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if got := inv.Devices[0]; got.MemoryTotalBytes != 100 || got.MemoryFreeBytes != 60 {
		t.Errorf("memory = total %d free %d, want 100/60", got.MemoryTotalBytes, got.MemoryFreeBytes)
	}
}

func TestDiscoverFallsBackWhenInitFails(t *testing.T) {
	tests := []struct {
		name       string
		init       func() nvml.Return
		count      int
		wantCount  int
		wantReason string
	}{
		{
			name:       "library not found",
			init:       func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
			count:      4,
			wantCount:  4,
			wantReason: "ERROR_LIBRARY_NOT_FOUND",
		},
		{
			name:       "driver not loaded",
			init:       func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED },
			count:      1,
			wantCount:  1,
			wantReason: "ERROR_DRIVER_NOT_LOADED",
		},
		{
			name:       "no permission, default count",
			init:       func() nvml.Return { return nvml.ERROR_NO_PERMISSION },
			count:      0,
			wantCount:  DefaultVirtualCount,
			wantReason: "ERROR_NO_PERMISSION",
		},
		{
			name:       "init panics",
			init:       func() nvml.Return { panic("dlopen exploded") },
			count:      3,
			wantCount:  3,
			wantReason: "dlopen exploded",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A bare mock: any call other than Init panics, which proves
			// discovery neither queries devices nor shuts down an NVML it
			// failed to initialise.
			lib := &mock.Interface{InitFunc: tt.init}
			log, buf := captureLogger()

			inv, err := Discover(Config{NVML: lib, VirtualCount: tt.count, Logger: log})
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if inv.Source != SourceVirtual || inv.DriverVersion != "" {
				t.Errorf("Source = %q, DriverVersion = %q; want virtual, empty", inv.Source, inv.DriverVersion)
			}
			if got := len(inv.Devices); got != tt.wantCount {
				t.Fatalf("got %d devices, want %d", got, tt.wantCount)
			}
			for i, d := range inv.Devices {
				if !d.Virtual || d.Index != i || d.Name != VirtualDeviceName {
					t.Errorf("device %d = %+v, want virtual device %d", i, d, i)
				}
			}
			if len(lib.InitCalls()) != 1 {
				t.Errorf("Init called %d times, want 1", len(lib.InitCalls()))
			}

			lines := logLines(buf)
			if len(lines) != 1 {
				t.Fatalf("want exactly one log line, got %d: %q", len(lines), lines)
			}
			line := lines[0]
			for _, want := range []string{
				"level=WARN",
				"NVML not available",
				"--gpus N",
				tt.wantReason,
				"virtual_gpus=" + strconv.Itoa(tt.wantCount),
			} {
				if !strings.Contains(line, want) {
					t.Errorf("log line %q does not contain %q", line, want)
				}
			}
		})
	}
}

func TestDiscoverDeviceErrors(t *testing.T) {
	failOn1 := func(ret nvml.Return) func(*server.Server) {
		return func(s *server.Server) {
			orig := s.DeviceGetHandleByIndexFunc
			s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
				if i == 1 {
					return nil, ret
				}
				return orig(i)
			}
		}
	}
	dev1 := func(s *server.Server) *server.Device { return s.Devices[1].(*server.Device) }

	tests := []struct {
		name    string
		break1  func(*server.Server)
		wantRet nvml.Return
		wantOp  string
	}{
		{
			name:    "get handle",
			break1:  failOn1(nvml.ERROR_GPU_IS_LOST),
			wantRet: nvml.ERROR_GPU_IS_LOST,
			wantOp:  "get handle",
		},
		{
			name: "get UUID",
			break1: func(s *server.Server) {
				dev1(s).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
			},
			wantRet: nvml.ERROR_UNKNOWN,
			wantOp:  "get UUID",
		},
		{
			name: "get name",
			break1: func(s *server.Server) {
				dev1(s).GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_NO_PERMISSION }
			},
			wantRet: nvml.ERROR_NO_PERMISSION,
			wantOp:  "get name",
		},
		{
			name: "get memory info",
			break1: func(s *server.Server) {
				dev1(s).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
			},
			wantRet: nvml.ERROR_NOT_SUPPORTED,
			wantOp:  "get memory info",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := dgxh200.New()
			shutdowns := countShutdowns(srv)
			tt.break1(srv)
			log, buf := captureLogger()

			inv, err := Discover(Config{NVML: srv, Logger: log})
			if err == nil {
				t.Fatalf("Discover succeeded with %d devices, want an error", len(inv.Devices))
			}
			if !errors.Is(err, ErrDeviceQuery) {
				t.Errorf("error %v is not ErrDeviceQuery", err)
			}
			if !errors.Is(err, tt.wantRet) {
				t.Errorf("error %v does not wrap %v", err, tt.wantRet)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "gpu: ") ||
				!strings.Contains(msg, "device 1:") || !strings.Contains(msg, tt.wantOp) {
				t.Errorf("error %q should be gpu-prefixed and name device 1 and %q", msg, tt.wantOp)
			}
			if len(inv.Devices) != 0 {
				t.Errorf("partial inventory returned alongside an error: %+v", inv)
			}
			if *shutdowns != 1 {
				t.Errorf("Shutdown called %d times, want 1 even on error", *shutdowns)
			}
			// A broken driver must be an error, never a silent fallback.
			if buf.Len() != 0 {
				t.Errorf("unexpected log output: %q", buf.String())
			}
		})
	}
}

func TestDiscoverDeviceCountError(t *testing.T) {
	srv := dgxh200.New()
	shutdowns := countShutdowns(srv)
	srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }

	_, err := Discover(Config{NVML: srv})
	if !errors.Is(err, ErrNVML) || !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("error = %v, want ErrNVML wrapping ERROR_UNKNOWN", err)
	}
	if *shutdowns != 1 {
		t.Errorf("Shutdown called %d times, want 1", *shutdowns)
	}
}

func TestDiscoverToleratesMissingDriverVersion(t *testing.T) {
	srv := dgxh200.New()
	srv.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED }

	inv, err := Discover(Config{NVML: srv})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if inv.DriverVersion != "" || len(inv.Devices) != 8 {
		t.Errorf("got driver %q and %d devices, want empty driver and 8 devices", inv.DriverVersion, len(inv.Devices))
	}
}

func TestDiscoverLogsFailedShutdown(t *testing.T) {
	srv := dgxh200.New()
	srv.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
	log, buf := captureLogger()

	inv, err := Discover(Config{NVML: srv, Logger: log})
	if err != nil {
		t.Fatalf("Discover: %v (a failed shutdown after a good read must not fail discovery)", err)
	}
	if len(inv.Devices) != 8 {
		t.Errorf("got %d devices, want 8", len(inv.Devices))
	}
	if lines := logLines(buf); len(lines) != 1 || !strings.Contains(lines[0], "shutdown") {
		t.Errorf("want one shutdown warning, got %q", lines)
	}
}

// TestDiscoverRealLibrary runs the real go-nvml library. On a machine
// without an NVIDIA driver (the usual dev and CI case) it must fall back to
// virtual devices instead of panicking; on a GPU node it must find real ones.
func TestDiscoverRealLibrary(t *testing.T) {
	log, buf := captureLogger()

	inv, err := Discover(Config{VirtualCount: 3, Logger: log})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	switch inv.Source {
	case SourceVirtual:
		if len(inv.Devices) != 3 {
			t.Errorf("got %d virtual devices, want 3", len(inv.Devices))
		}
		lines := logLines(buf)
		if len(lines) != 1 || !strings.Contains(lines[0], "NVML not available") {
			t.Errorf("want one fallback warning, got %q", lines)
		}
		t.Logf("no NVIDIA driver here: %s", lines)
	case SourceNVML:
		if inv.DriverVersion == "" {
			t.Error("real NVML reported no driver version")
		}
		for _, d := range inv.Devices {
			if d.Virtual || !strings.HasPrefix(d.UUID, "GPU-") || d.MemoryTotalBytes == 0 {
				t.Errorf("implausible real device: %+v", d)
			}
		}
		t.Logf("real NVML: driver %s, devices %+v", inv.DriverVersion, inv.Devices)
	default:
		t.Fatalf("Source = %q", inv.Source)
	}
}

func TestDefaultConfig(t *testing.T) {
	cfg := DefaultConfig()
	if cfg.NVML != nil || cfg.VirtualCount != DefaultVirtualCount || cfg.Logger == nil {
		t.Errorf("DefaultConfig() = %+v", cfg)
	}
}
