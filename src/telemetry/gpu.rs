//! GPU memory in use per device, read through NVML when the build has the `gpu-metrics`
//! feature (implied by `cuda`). NVML is loaded at run time, so a build with the feature
//! still runs, without the gauge, on a machine without NVIDIA's driver.

/// `(device index, bytes used)` for every GPU NVML sees; empty without NVML.
#[cfg(feature = "gpu-metrics")]
pub fn memory_used() -> Vec<(u32, u64)> {
    use std::sync::OnceLock;

    use nvml_wrapper::Nvml;

    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    let Some(nvml) = NVML.get_or_init(|| match Nvml::init() {
        Ok(nvml) => Some(nvml),
        Err(error) => {
            tracing::warn!(error = %error, "NVML is not available; no GPU memory gauge.");
            None
        }
    }) else {
        return Vec::new();
    };
    let count = nvml.device_count().unwrap_or(0);
    (0..count)
        .filter_map(|index| {
            let device = nvml.device_by_index(index).ok()?;
            Some((index, device.memory_info().ok()?.used))
        })
        .collect()
}

/// `(device index, bytes used)` for every GPU; this build has no NVML.
#[cfg(not(feature = "gpu-metrics"))]
pub fn memory_used() -> Vec<(u32, u64)> {
    Vec::new()
}
