//! Whether this machine gives its free memory back to a host: a virtual
//! machine's balloon device with free page reporting (virtio-balloon's
//! `VIRTIO_BALLOON_F_REPORTING`). The host then takes freed pages back
//! within seconds, and the first write to each page the guest uses again
//! waits for the host to fault it in: a write into new page-cache pages
//! goes at the host's pace, not the file system's.

use std::path::Path;

/// Where Linux lists the devices bound to the balloon driver.
const DRIVER: &str = "/sys/bus/virtio/drivers/virtio_balloon";

/// The feature bit of free page reporting (virtio 1.2, 5.5.3).
const F_REPORTING: usize = 5;

/// Whether a balloon device of this machine reports free pages to its host.
pub fn reports_free_pages() -> bool {
    reports_free_pages_in(Path::new(DRIVER))
}

/// As [`reports_free_pages`], for the driver's directory `driver`.
fn reports_free_pages_in(driver: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(driver) else {
        return false;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("virtio"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("features")).ok())
        .any(|f| has_feature(&f, F_REPORTING))
}

/// Whether a device's `features` (one `0` or `1` per bit, bit 0 first, as
/// sysfs shows them) has `bit` set.
fn has_feature(features: &str, bit: usize) -> bool {
    features.trim().as_bytes().get(bit) == Some(&b'1')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reporting_bit_is_read_from_the_features_string() {
        // As a KVM guest's balloon shows them: stats, deflate on OOM,
        // reporting, and VIRTIO_F_VERSION_1 at bit 32.
        let kvm = "0110010100000000000000000000000010000000\n";
        assert!(has_feature(kvm, F_REPORTING));
        assert!(has_feature(kvm, 1));
        assert!(!has_feature(kvm, 3));
        assert!(!has_feature("0110000", F_REPORTING));
        assert!(!has_feature("0110", F_REPORTING), "too short: not set");
        assert!(!has_feature("", F_REPORTING));
    }

    #[test]
    fn a_device_of_the_driver_with_the_bit_is_found_and_none_without() {
        let d = tempfile::tempdir().unwrap();
        assert!(!reports_free_pages_in(&d.path().join("absent")));
        let dev = d.path().join("virtio3");
        std::fs::create_dir(&dev).unwrap();
        // Files of the driver beside its devices are not devices.
        std::fs::write(d.path().join("uevent"), "").unwrap();
        std::fs::write(dev.join("features"), "0110000100\n").unwrap();
        assert!(!reports_free_pages_in(d.path()));
        std::fs::write(dev.join("features"), "0110010100\n").unwrap();
        assert!(reports_free_pages_in(d.path()));
    }
}
