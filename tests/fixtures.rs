//! The machine-wide fixtures some tests build once and cache in
//! /var/cache/profilerd-tests: the Parca server (tests/parca.rs, minutes of
//! `go build` on a fresh machine) and the Debian root file system the systemd
//! tests boot (tests/systemd.rs, debootstrap). scripts/test.sh runs this
//! first, in the background, while the daemon and the other tests compile;
//! each builder takes a machine-wide lock, so a test that needs a fixture
//! meanwhile waits for it instead of building it twice.

#[test]
#[ignore = "run by scripts/test.sh ahead of the suite (cargo test --test fixtures -- --ignored)"]
fn the_cached_fixtures_are_built() {
    let parca = std::thread::spawn(profilerd_tests::parca::binary);
    let rootfs = profilerd_tests::rootfs::cached_rootfs();
    let parca = parca.join().expect("building Parca");
    assert!(parca.is_file(), "{} is no file", parca.display());
    assert!(rootfs.is_dir(), "{} is no directory", rootfs.display());
}
