package gpu

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func nvmlInventory(n int) Inventory {
	devs := make([]Device, n)
	for i := range devs {
		devs[i] = Device{Index: i, UUID: "GPU-real-" + string(rune('a'+i)), Name: "NVIDIA H200"}
	}
	return Inventory{Devices: devs, Source: SourceNVML, DriverVersion: "550.54.15"}
}

func TestSelect(t *testing.T) {
	tests := []struct {
		name    string
		inv     Inventory
		n       int
		wantIdx []int
		wantErr error
		wantMsg string
	}{
		{name: "one of eight", inv: nvmlInventory(8), n: 1, wantIdx: []int{0}},
		{name: "four of eight", inv: nvmlInventory(8), n: 4, wantIdx: []int{0, 1, 2, 3}},
		{name: "all", inv: nvmlInventory(2), n: 2, wantIdx: []int{0, 1}},
		{
			name:    "too few real",
			inv:     nvmlInventory(2),
			n:       4,
			wantErr: ErrNotEnoughGPUs,
			wantMsg: "gpu: not enough GPUs: 4 local ranks need 4 GPUs but only 2 were found (nvml); " +
				"lower --data-parallel-size-local or run on a node with more GPUs",
		},
		{
			name:    "too few virtual",
			inv:     Inventory{Devices: virtualDevices(1), Source: SourceVirtual},
			n:       2,
			wantErr: ErrNotEnoughGPUs,
			wantMsg: "gpu: not enough GPUs: 2 local ranks need 2 GPUs but only 1 was found (virtual); " +
				"lower --data-parallel-size-local or raise --gpus (no NVIDIA driver was found, so the GPUs are virtual)",
		},
		{
			name:    "none found",
			inv:     Inventory{Source: SourceNVML},
			n:       1,
			wantErr: ErrNotEnoughGPUs,
			wantMsg: "gpu: not enough GPUs: 1 local rank needs 1 GPU but only 0 were found (nvml); " +
				"lower --data-parallel-size-local or run on a node with more GPUs",
		},
		{name: "zero ranks", inv: nvmlInventory(2), n: 0, wantErr: ErrInvalidRankCount},
		{name: "negative ranks", inv: nvmlInventory(2), n: -1, wantErr: ErrInvalidRankCount},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.inv.Select(tt.n)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Select(%d) error = %v, want %v", tt.n, err, tt.wantErr)
				}
				if tt.wantMsg != "" && err.Error() != tt.wantMsg {
					t.Errorf("message\n got: %s\nwant: %s", err, tt.wantMsg)
				}
				if got != nil {
					t.Errorf("devices returned alongside an error: %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Select(%d): %v", tt.n, err)
			}
			var idx []int
			for _, d := range got {
				idx = append(idx, d.Index)
			}
			if !slices.Equal(idx, tt.wantIdx) {
				t.Errorf("Select(%d) indices = %v, want %v", tt.n, idx, tt.wantIdx)
			}
		})
	}
}

func TestSelectReturnsCopy(t *testing.T) {
	inv := nvmlInventory(2)
	got, err := inv.Select(2)
	if err != nil {
		t.Fatal(err)
	}
	got[0].UUID = "changed"
	if inv.Devices[0].UUID == "changed" {
		t.Error("Select aliases the inventory: mutating the result changed Devices")
	}
}

func TestVirtualDevices(t *testing.T) {
	a, b := virtualDevices(4), virtualDevices(4)
	if !slices.Equal(a, b) {
		t.Fatal("virtual devices are not deterministic")
	}
	if got := virtualDevices(2); !slices.Equal(got, a[:2]) {
		t.Error("a device's identity depends on how many devices are faked")
	}
	seen := map[string]bool{}
	for i, d := range a {
		if d.Index != i || !d.Virtual || d.Name != VirtualDeviceName {
			t.Errorf("device %d = %+v", i, d)
		}
		if !strings.HasPrefix(d.UUID, "GPU-virtual-") || seen[d.UUID] {
			t.Errorf("device %d: bad or duplicate UUID %q", i, d.UUID)
		}
		seen[d.UUID] = true
		if d.MemoryTotalBytes != 80<<30 || d.MemoryFreeBytes != d.MemoryTotalBytes {
			t.Errorf("device %d memory = %d/%d, want 80 GiB free", i, d.MemoryFreeBytes, d.MemoryTotalBytes)
		}
	}
	if a[0].UUID != "GPU-virtual-0000-0000-0000-000000000000" {
		t.Errorf("UUID format changed: %q", a[0].UUID)
	}
}
