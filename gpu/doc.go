// Package gpu discovers the GPUs of the local node and hands them out to
// data-parallel ranks.
//
// dpnode runs one engine per data-parallel rank and binds each engine to
// exactly one GPU, so the rest of the runtime needs a small, stable view of
// the node: which devices exist, what they are called, how much memory they
// have. This package owns that view and nothing else: it queries NVML once at
// startup (Discover), and maps local ranks to devices (Inventory.Select).
// It does not allocate memory, set CUDA_VISIBLE_DEVICES or watch device
// health.
//
// Machines without an NVIDIA driver (laptops, CI runners) are a first-class
// case rather than an error: Discover falls back to a configurable number of
// virtual devices so that the whole serving stack can be developed and tested
// without GPUs. Virtual devices are marked with Device.Virtual and
// Inventory.Source, so code that must not run on them can refuse.
package gpu
