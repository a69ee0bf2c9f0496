//! The GPUs through NVML when the build has the `gpu-metrics` feature (implied by `cuda`):
//! memory in use and in all per device, and which GPU, driver and CUDA version the model
//! runs on (part of the `system_fingerprint`). NVML is loaded at run time, so a build with
//! the feature still runs, without the gauges, on a machine without NVIDIA's driver.

use crate::fingerprint::Accelerator;

/// One device's memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuMemory {
    pub index: u32,
    pub used: u64,
    pub total: u64,
}

#[cfg(feature = "gpu-metrics")]
fn nvml() -> Option<&'static nvml_wrapper::Nvml> {
    use std::sync::OnceLock;
    static NVML: OnceLock<Option<nvml_wrapper::Nvml>> = OnceLock::new();
    NVML.get_or_init(|| match nvml_wrapper::Nvml::init() {
        Ok(nvml) => Some(nvml),
        Err(error) => {
            tracing::warn!(error = %error, "NVML is not available; no GPU gauges.");
            None
        }
    })
    .as_ref()
}

/// Memory of every GPU NVML sees; empty without NVML.
#[cfg(feature = "gpu-metrics")]
pub fn memory() -> Vec<GpuMemory> {
    let Some(nvml) = nvml() else {
        return Vec::new();
    };
    let count = nvml.device_count().unwrap_or(0);
    (0..count)
        .filter_map(|index| {
            let info = nvml.device_by_index(index).ok()?.memory_info().ok()?;
            Some(GpuMemory {
                index,
                used: info.used,
                total: info.total,
            })
        })
        .collect()
}

/// The first GPU, its driver and the CUDA version the driver supports; empty strings
/// where NVML cannot tell.
#[cfg(feature = "gpu-metrics")]
pub fn accelerator() -> Accelerator {
    let Some(nvml) = nvml() else {
        return Accelerator::default();
    };
    let cuda = nvml
        .sys_cuda_driver_version()
        .map(|v| format!("{}.{}", v / 1000, v % 1000 / 10))
        .unwrap_or_default();
    Accelerator {
        gpu: nvml
            .device_by_index(0)
            .and_then(|d| d.name())
            .unwrap_or_default(),
        driver: nvml.sys_driver_version().unwrap_or_default(),
        cuda,
    }
}

/// This build has no NVML.
#[cfg(not(feature = "gpu-metrics"))]
pub fn memory() -> Vec<GpuMemory> {
    Vec::new()
}

/// This build has no NVML: no GPU.
#[cfg(not(feature = "gpu-metrics"))]
pub fn accelerator() -> Accelerator {
    Accelerator::default()
}

/// Whether NVML sees at least one GPU (`engine = "auto"` runs mistral.rs on it in a CUDA
/// build); always false without NVML.
pub fn visible() -> bool {
    !memory().is_empty()
}
