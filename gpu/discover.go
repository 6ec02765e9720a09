package gpu

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// DefaultVirtualCount is how many virtual devices stand in for GPUs when
// NVML is unavailable. Two is the smallest number that still exercises the
// multi-rank paths (routing, rank-to-device mapping) on a GPU-less machine,
// while staying cheap enough for laptops and CI.
const DefaultVirtualCount = 2

var (
	// ErrNVML is returned when NVML initialised but a node-wide query
	// (such as the device count) failed. The wrapped nvml.Return is still
	// reachable with errors.Is.
	ErrNVML = errors.New("gpu: nvml query failed")
	// ErrDeviceQuery is returned when querying one device failed. The error
	// names the device index; the nvml.Return is reachable with errors.Is.
	ErrDeviceQuery = errors.New("gpu: device query failed")
)

// Library is the part of NVML that discovery uses. It is deliberately
// narrow so tests can fake it cheaply; nvml.Interface, nvml.New() and the
// go-nvml mocks all satisfy it.
type Library interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	SystemGetDriverVersion() (string, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// Config controls Discover. The zero value is usable and equals
// DefaultConfig().
type Config struct {
	// NVML is the library to query. Nil means the real libnvidia-ml.so,
	// loaded at Discover time; tests inject go-nvml mocks here.
	NVML Library
	// VirtualCount is how many virtual devices to fake when NVML cannot be
	// initialised. Values < 1 mean DefaultVirtualCount, because a node with
	// zero devices cannot host a rank and would only fail later and more
	// obscurely. It is ignored when NVML works: real hardware always wins.
	VirtualCount int
	// Logger receives the one warning emitted when falling back to virtual
	// devices. Nil means slog.Default(), so the warning is never lost.
	Logger *slog.Logger
}

// DefaultConfig returns the configuration used by the node binary: real
// NVML, DefaultVirtualCount virtual devices as fallback, default logger.
func DefaultConfig() Config {
	return Config{VirtualCount: DefaultVirtualCount, Logger: slog.Default()}
}

// Discover lists the node's GPUs through NVML.
//
// If NVML cannot be initialised for any reason (no driver installed, driver
// not loaded, no permission) it returns cfg.VirtualCount virtual devices and
// logs one warning instead of failing, so the runtime stays usable on
// machines without GPUs. Once NVML is up, however, any failure is returned
// as an error: a half-working driver on a GPU node must not be papered over
// with fake devices.
func Discover(cfg Config) (Inventory, error) {
	lib := cfg.NVML
	if lib == nil {
		lib = nvml.New()
	}
	if err := initNVML(lib); err != nil {
		n := virtualCount(cfg.VirtualCount)
		logger(cfg).Warn("gpu: NVML not available, using virtual GPUs (--gpus N sets how many)",
			"reason", err.Error(), "virtual_gpus", n)
		return Inventory{Devices: virtualDevices(n), Source: SourceVirtual}, nil
	}
	inv, err := query(lib)
	if ret := lib.Shutdown(); ret != nvml.SUCCESS && err == nil {
		// Everything needed was read; a failed shutdown only leaks driver
		// state in this process, which is not worth refusing to start over.
		logger(cfg).Warn("gpu: NVML shutdown failed", "reason", ret.Error())
	}
	return inv, err
}

// initNVML initialises lib, turning a panic into an error: the fallback
// exists precisely for broken or missing driver installs, so a library that
// panics while loading must take that path instead of crashing the node.
func initNVML(lib Library) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("nvml init panicked: %v", r)
		}
	}()
	return nvmlError(lib.Init())
}

// query reads the inventory from an initialised lib.
func query(lib Library) (Inventory, error) {
	count, ret := lib.DeviceGetCount()
	if err := nvmlError(ret); err != nil {
		return Inventory{}, fmt.Errorf("%w: device count: %w", ErrNVML, err)
	}
	// The driver version only feeds logs and diagnostics, so a driver that
	// will not report it is no reason to refuse to serve.
	driver, _ := lib.SystemGetDriverVersion()

	devs := make([]Device, 0, count)
	for i := range count {
		d, err := queryDevice(lib, i)
		if err != nil {
			return Inventory{}, err
		}
		devs = append(devs, d)
	}
	return Inventory{Devices: devs, Source: SourceNVML, DriverVersion: driver}, nil
}

func queryDevice(lib Library, i int) (Device, error) {
	fail := func(op string, ret nvml.Return) error {
		return fmt.Errorf("%w: device %d: %s: %w", ErrDeviceQuery, i, op, ret)
	}
	h, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return Device{}, fail("get handle", ret)
	}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return Device{}, fail("get UUID", ret)
	}
	name, ret := h.GetName()
	if ret != nvml.SUCCESS {
		return Device{}, fail("get name", ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Device{}, fail("get memory info", ret)
	}
	return Device{
		Index:            i,
		UUID:             uuid,
		Name:             name,
		MemoryTotalBytes: mem.Total,
		MemoryFreeBytes:  mem.Free,
	}, nil
}

// nvmlError turns an nvml.Return into an error. nvml.Return already
// implements error, but SUCCESS must become nil for the usual err != nil
// checks to work.
func nvmlError(ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return ret
}

func virtualCount(n int) int {
	if n < 1 {
		return DefaultVirtualCount
	}
	return n
}

func logger(cfg Config) *slog.Logger {
	if cfg.Logger == nil {
		return slog.Default()
	}
	return cfg.Logger
}
