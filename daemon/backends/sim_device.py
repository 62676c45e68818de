"""The device the sim backend pretends to be: an H100 SXM 80GB look-alike.

Programs size their launches and code paths from device attributes, so the sim reports
realistic ones. Keys are `enum cudaDeviceAttr` values (driver_types.h, CUDA 13); the values
follow an H100 SXM5 80GB as deviceQuery reports it. Attributes not listed read as absent.
"""

from __future__ import annotations

import hashlib

from pilot.daemon.backends.base import DeviceInfo

SIM_DEVICE_NAME = "pilot simulated GPU (H100-like)"
SIM_DRIVER_VERSION = 13000

H100_ATTRS: dict[int, int] = {
    1: 1024,         # cudaDevAttrMaxThreadsPerBlock
    2: 1024,         # cudaDevAttrMaxBlockDimX
    3: 1024,         # cudaDevAttrMaxBlockDimY
    4: 64,           # cudaDevAttrMaxBlockDimZ
    5: 2**31 - 1,    # cudaDevAttrMaxGridDimX
    6: 65535,        # cudaDevAttrMaxGridDimY
    7: 65535,        # cudaDevAttrMaxGridDimZ
    8: 49152,        # cudaDevAttrMaxSharedMemoryPerBlock
    9: 65536,        # cudaDevAttrTotalConstantMemory
    10: 32,          # cudaDevAttrWarpSize
    11: 2**31 - 1,   # cudaDevAttrMaxPitch
    12: 65536,       # cudaDevAttrMaxRegistersPerBlock
    13: 1980000,     # cudaDevAttrClockRate (kHz)
    14: 512,         # cudaDevAttrTextureAlignment
    15: 1,           # cudaDevAttrGpuOverlap
    16: 132,         # cudaDevAttrMultiProcessorCount
    17: 0,           # cudaDevAttrKernelExecTimeout
    18: 0,           # cudaDevAttrIntegrated
    19: 1,           # cudaDevAttrCanMapHostMemory
    20: 0,           # cudaDevAttrComputeMode (cudaComputeModeDefault)
    21: 131072,      # cudaDevAttrMaxTexture1DWidth
    22: 131072,      # cudaDevAttrMaxTexture2DWidth
    23: 65536,       # cudaDevAttrMaxTexture2DHeight
    24: 16384,       # cudaDevAttrMaxTexture3DWidth
    25: 16384,       # cudaDevAttrMaxTexture3DHeight
    26: 16384,       # cudaDevAttrMaxTexture3DDepth
    27: 32768,       # cudaDevAttrMaxTexture2DLayeredWidth
    28: 32768,       # cudaDevAttrMaxTexture2DLayeredHeight
    29: 2048,        # cudaDevAttrMaxTexture2DLayeredLayers
    30: 512,         # cudaDevAttrSurfaceAlignment
    31: 1,           # cudaDevAttrConcurrentKernels
    32: 1,           # cudaDevAttrEccEnabled
    33: 0x1B,        # cudaDevAttrPciBusId
    34: 0,           # cudaDevAttrPciDeviceId
    35: 0,           # cudaDevAttrTccDriver
    36: 2619000,     # cudaDevAttrMemoryClockRate (kHz)
    37: 5120,        # cudaDevAttrGlobalMemoryBusWidth (bits)
    38: 52428800,    # cudaDevAttrL2CacheSize (50 MiB)
    39: 2048,        # cudaDevAttrMaxThreadsPerMultiProcessor
    40: 3,           # cudaDevAttrAsyncEngineCount
    41: 1,           # cudaDevAttrUnifiedAddressing
    42: 32768,       # cudaDevAttrMaxTexture1DLayeredWidth
    43: 2048,        # cudaDevAttrMaxTexture1DLayeredLayers
    45: 32768,       # cudaDevAttrMaxTexture2DGatherWidth
    46: 32768,       # cudaDevAttrMaxTexture2DGatherHeight
    47: 8192,        # cudaDevAttrMaxTexture3DWidthAlt
    48: 8192,        # cudaDevAttrMaxTexture3DHeightAlt
    49: 32768,       # cudaDevAttrMaxTexture3DDepthAlt
    50: 0,           # cudaDevAttrPciDomainId
    51: 32,          # cudaDevAttrTexturePitchAlignment
    52: 32768,       # cudaDevAttrMaxTextureCubemapWidth
    53: 32768,       # cudaDevAttrMaxTextureCubemapLayeredWidth
    54: 2046,        # cudaDevAttrMaxTextureCubemapLayeredLayers
    55: 32768,       # cudaDevAttrMaxSurface1DWidth
    56: 131072,      # cudaDevAttrMaxSurface2DWidth
    57: 65536,       # cudaDevAttrMaxSurface2DHeight
    58: 16384,       # cudaDevAttrMaxSurface3DWidth
    59: 16384,       # cudaDevAttrMaxSurface3DHeight
    60: 16384,       # cudaDevAttrMaxSurface3DDepth
    61: 32768,       # cudaDevAttrMaxSurface1DLayeredWidth
    62: 2048,        # cudaDevAttrMaxSurface1DLayeredLayers
    63: 32768,       # cudaDevAttrMaxSurface2DLayeredWidth
    64: 32768,       # cudaDevAttrMaxSurface2DLayeredHeight
    65: 2048,        # cudaDevAttrMaxSurface2DLayeredLayers
    66: 32768,       # cudaDevAttrMaxSurfaceCubemapWidth
    67: 32768,       # cudaDevAttrMaxSurfaceCubemapLayeredWidth
    68: 2046,        # cudaDevAttrMaxSurfaceCubemapLayeredLayers
    69: 268435456,   # cudaDevAttrMaxTexture1DLinearWidth
    70: 131072,      # cudaDevAttrMaxTexture2DLinearWidth
    71: 65000,       # cudaDevAttrMaxTexture2DLinearHeight
    72: 2097120,     # cudaDevAttrMaxTexture2DLinearPitch
    73: 32768,       # cudaDevAttrMaxTexture2DMipmappedWidth
    74: 32768,       # cudaDevAttrMaxTexture2DMipmappedHeight
    75: 9,           # cudaDevAttrComputeCapabilityMajor
    76: 0,           # cudaDevAttrComputeCapabilityMinor
    77: 32768,       # cudaDevAttrMaxTexture1DMipmappedWidth
    78: 1,           # cudaDevAttrStreamPrioritiesSupported
    79: 1,           # cudaDevAttrGlobalL1CacheSupported
    80: 1,           # cudaDevAttrLocalL1CacheSupported
    81: 233472,      # cudaDevAttrMaxSharedMemoryPerMultiprocessor
    82: 65536,       # cudaDevAttrMaxRegistersPerMultiprocessor
    83: 1,           # cudaDevAttrManagedMemory
    84: 0,           # cudaDevAttrIsMultiGpuBoard
    85: 0,           # cudaDevAttrMultiGpuBoardGroupID
    86: 0,           # cudaDevAttrHostNativeAtomicSupported
    87: 2,           # cudaDevAttrSingleToDoublePrecisionPerfRatio
    88: 0,           # cudaDevAttrPageableMemoryAccess (no HMM, as on the lab H100)
    89: 1,           # cudaDevAttrConcurrentManagedAccess
    90: 1,           # cudaDevAttrComputePreemptionSupported
    91: 0,           # cudaDevAttrCanUseHostPointerForRegisteredMem
    95: 1,           # cudaDevAttrCooperativeLaunch
    97: 232448,      # cudaDevAttrMaxSharedMemoryPerBlockOptin
    98: 0,           # cudaDevAttrCanFlushRemoteWrites
    99: 1,           # cudaDevAttrHostRegisterSupported
    100: 0,          # cudaDevAttrPageableMemoryAccessUsesHostPageTables
    101: 0,          # cudaDevAttrDirectManagedMemAccessFromHost
    106: 32,         # cudaDevAttrMaxBlocksPerMultiprocessor
    108: 32505856,   # cudaDevAttrMaxPersistingL2CacheSize (approximate)
    109: 134213632,  # cudaDevAttrMaxAccessPolicyWindowSize
    111: 1024,       # cudaDevAttrReservedSharedMemoryPerBlock
    112: 1,          # cudaDevAttrSparseCudaArraySupported
    113: 1,          # cudaDevAttrHostRegisterReadOnlySupported
    114: 1,          # cudaDevAttrTimelineSemaphoreInteropSupported
    115: 1,          # cudaDevAttrMemoryPoolsSupported
    116: 1,          # cudaDevAttrGPUDirectRDMASupported
    117: 1,          # cudaDevAttrGPUDirectRDMAFlushWritesOptions (host bit)
    118: 0,          # cudaDevAttrGPUDirectRDMAWritesOrdering (none)
    119: 1,          # cudaDevAttrMemoryPoolSupportedHandleTypes (POSIX fd)
    120: 1,          # cudaDevAttrClusterLaunch
    121: 1,          # cudaDevAttrDeferredMappingCudaArraySupported
    125: 1,          # cudaDevAttrIpcEventSupport
    126: 4,          # cudaDevAttrMemSyncDomainCount
    129: 1,          # CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS (cudaDevAttrReserved129)
    130: 0,          # cudaDevAttrNumaConfig (cudaDeviceNumaConfigNone)
    131: -1,         # cudaDevAttrNumaId
    133: 0,          # cudaDevAttrMpsEnabled
    134: 0,          # cudaDevAttrHostNumaId
    139: 0x2330_10DE,  # cudaDevAttrGpuPciDeviceId (device 0x2330 H100 SXM5 80GB, vendor NVIDIA)
}


def sim_uuid(index: int) -> bytes:
    """Simulated device `index`'s 16-byte UUID: fixed, and like real ones different from the
    first hex digits on (devices 0 and 1 share only the first: "GPU-4")."""
    return hashlib.sha256(f"pilot-sim-gpu-{index}".encode()).digest()[:16]


def sim_pci_bus(index: int) -> int:
    """Simulated device `index`'s PCI bus: 0x1B, 0x23, ... with each pair swapped (device 0 on
    0x23, device 1 on 0x1B, device 2 on 0x33, ...), so CUDA's default order (the sim's index
    order) and CUDA_DEVICE_ORDER=PCI_BUS_ID differ, as they may on a real server."""
    return H100_ATTRS[33] + 8 * (index ^ 1)


def h100_like_info(total_mem: int, index: int = 0) -> DeviceInfo:
    """DeviceInfo for simulated device `index`; devices differ in UUID and PCI bus only."""
    attrs = dict(H100_ATTRS)
    attrs[33] = sim_pci_bus(index)  # cudaDevAttrPciBusId
    return DeviceInfo(
        name=SIM_DEVICE_NAME,
        uuid=sim_uuid(index),
        total_mem=total_mem,
        driver_version=SIM_DRIVER_VERSION,
        attrs=attrs,
    )
