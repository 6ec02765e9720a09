package gpu

import "fmt"

const (
	// VirtualDeviceName is the Name of every virtual device; it is obviously
	// not a real product so it cannot be mistaken for one in logs.
	VirtualDeviceName = "virtual-gpu"
	// VirtualMemoryBytes is the memory each virtual device claims: 80 GiB,
	// the size of the most common datacenter serving GPU (A100/H100 80GB),
	// so memory planning such as KV-cache sizing produces realistic numbers
	// when developing without a GPU.
	VirtualMemoryBytes uint64 = 80 << 30
)

// virtualDevices fakes n devices. The UUIDs depend only on the index, so
// runs are reproducible and logs from different runs can be compared.
func virtualDevices(n int) []Device {
	devs := make([]Device, n)
	for i := range devs {
		devs[i] = Device{
			Index: i,
			// Keeps the "GPU-" prefix and dashed groups of real NVML UUIDs
			// so anything matching on the prefix still works, while the
			// word "virtual" makes it impossible to mistake for hardware.
			UUID:             fmt.Sprintf("GPU-virtual-0000-0000-0000-%012d", i),
			Name:             VirtualDeviceName,
			MemoryTotalBytes: VirtualMemoryBytes,
			// Nothing ever runs on a virtual device, so all of it is free.
			MemoryFreeBytes: VirtualMemoryBytes,
			Virtual:         true,
		}
	}
	return devs
}
