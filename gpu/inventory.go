package gpu

import (
	"errors"
	"fmt"
	"slices"
)

// Sources an Inventory can come from. They are plain strings so they can go
// straight into logs, metrics labels and error messages.
const (
	SourceNVML    = "nvml"
	SourceVirtual = "virtual"
	// SourceServers are ranks an engine brings: servers that already
	// run, one per rank, whatever GPUs this machine has.
	SourceServers = "servers"
)

var (
	// ErrNotEnoughGPUs is returned by Inventory.Select when the node has
	// fewer devices than the requested number of local ranks.
	ErrNotEnoughGPUs = errors.New("gpu: not enough GPUs")
	// ErrInvalidRankCount is returned by Inventory.Select for n < 1: a node
	// that runs no rank should not be asking for devices, so this is a
	// configuration bug worth surfacing rather than an empty result.
	ErrInvalidRankCount = errors.New("gpu: invalid local rank count")
)

// Device is one GPU as seen at discovery time.
type Device struct {
	// Index is the NVML device index, which is also the CUDA ordinal when
	// CUDA_DEVICE_ORDER=PCI_BUS_ID and no CUDA_VISIBLE_DEVICES filter is set.
	Index int
	// UUID is the stable identity ("GPU-…"); prefer it over Index in logs
	// because indices can change across reboots and driver upgrades.
	UUID string
	// Name is the marketing name, e.g. "NVIDIA H200 141GB HBM3e".
	Name string
	// MemoryTotalBytes is the framebuffer size.
	MemoryTotalBytes uint64
	// MemoryFreeBytes is the free framebuffer at discovery time; 0 means
	// unknown, not full, because some drivers and mocks do not report it.
	MemoryFreeBytes uint64
	// Virtual is true for devices invented because NVML was unavailable.
	Virtual bool
}

// Inventory is the result of one discovery.
type Inventory struct {
	// Devices are ordered by Index, starting at 0 with no gaps.
	Devices []Device
	// Source is SourceNVML or SourceVirtual.
	Source string
	// DriverVersion is the NVIDIA driver version; empty for virtual
	// inventories or when the driver would not report it.
	DriverVersion string
}

// Select returns the devices for n local ranks: rank i gets Devices[i]. The
// first n are taken because NVML orders devices by PCI bus, so neighbouring
// ranks land on neighbouring GPUs, which usually share the fastest links.
// The result is a copy, so callers may keep or modify it freely.
func (inv Inventory) Select(n int) ([]Device, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: %d (need at least 1)", ErrInvalidRankCount, n)
	}
	if have := len(inv.Devices); n > have {
		return nil, fmt.Errorf("%w: %s %s %s but only %d %s found (%s); %s",
			ErrNotEnoughGPUs, plural(n, "local rank", "local ranks"), pick(n == 1, "needs", "need"),
			plural(n, "GPU", "GPUs"), have, pick(have == 1, "was", "were"), inv.Source, remedy(inv.Source))
	}
	return slices.Clone(inv.Devices[:n]), nil
}

// remedy tells the user which knob fixes a shortage; with virtual devices
// the count is ours to choose, so --gpus is the cheaper fix.
func remedy(source string) string {
	if source == SourceServers {
		return "give the engine one server per local rank, or lower --data-parallel-size-local"
	}
	if source == SourceVirtual {
		return "lower --data-parallel-size-local or raise --gpus (no NVIDIA driver was found, so the GPUs are virtual)"
	}
	return "lower --data-parallel-size-local or run on a node with more GPUs"
}

func plural(n int, one, many string) string {
	return fmt.Sprintf("%d %s", n, pick(n == 1, one, many))
}

func pick(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}
