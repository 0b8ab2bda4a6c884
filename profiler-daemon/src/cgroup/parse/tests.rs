use super::*;

const DOCKER_ID: &str = "4f1e0c2ab3d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f";
const OTHER_ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn unit(path: &str) -> Option<String> {
    unit_of(path)
}

#[test]
fn system_units() {
    assert_eq!(
        unit("/system.slice/nginx.service").as_deref(),
        Some("nginx.service")
    );
    assert_eq!(
        unit("/system.slice/system-postgresql.slice/postgresql@16-main.service").as_deref(),
        Some("postgresql@16-main.service")
    );
    assert_eq!(
        unit("/system.slice/system-getty.slice/getty@tty1.service").as_deref(),
        Some("getty@tty1.service")
    );
    assert_eq!(unit("/init.scope").as_deref(), Some("init.scope"));
    assert_eq!(
        unit("/system.slice/run-r3b2c1d0e.scope").as_deref(),
        Some("run-r3b2c1d0e.scope")
    );
    assert_eq!(unit("/system.slice/-.mount").as_deref(), Some("-.mount"));
    assert_eq!(
        unit("/system.slice/dev-sda2.swap").as_deref(),
        Some("dev-sda2.swap")
    );
    // systemd escapes `-` in paths as \x2d.
    assert_eq!(
        unit("/system.slice/systemd-fsck@dev-disk-by\\x2duuid-1234.service").as_deref(),
        Some("systemd-fsck@dev-disk-by\\x2duuid-1234.service")
    );
}

#[test]
fn a_services_own_sub_cgroups_belong_to_it() {
    // A Delegate=yes service: names below it are its own, whatever they look like.
    assert_eq!(
        unit("/system.slice/containerd.service/payload/nginx.service").as_deref(),
        Some("containerd.service")
    );
    assert_eq!(
        unit(&format!("/system.slice/docker-{DOCKER_ID}.scope/init.scope")).as_deref(),
        Some(&*format!("docker-{DOCKER_ID}.scope"))
    );
}

#[test]
fn sessions_and_user_units() {
    assert_eq!(
        unit("/user.slice/user-1000.slice/session-3.scope").as_deref(),
        Some("session-3.scope")
    );
    assert_eq!(
        unit("/user.slice/user-1000.slice/user@1000.service/app.slice/x.service").as_deref(),
        Some("user@1000.service/x.service")
    );
    assert_eq!(
        unit("/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-4242.scope")
            .as_deref(),
        Some("user@1000.service/app-gnome-firefox-4242.scope")
    );
    assert_eq!(
        unit("/user.slice/user-1000.slice/user@1000.service/init.scope").as_deref(),
        Some("user@1000.service/init.scope")
    );
    // A user's nginx.service is not the system's.
    assert_eq!(
        unit("/user.slice/user-1000.slice/user@1000.service/app.slice/nginx.service").as_deref(),
        Some("user@1000.service/nginx.service")
    );
    // The manager itself, with no unit below it.
    assert_eq!(
        unit("/user.slice/user-1000.slice/user@1000.service").as_deref(),
        Some("user@1000.service")
    );
    // Not a manager: a uid must be digits.
    assert_eq!(
        unit("/user.slice/user@x.service/app.slice/y.service").as_deref(),
        Some("user@x.service")
    );
}

#[test]
fn slices_and_non_units() {
    assert_eq!(
        unit("/user.slice/user-1000.slice").as_deref(),
        Some("user-1000.slice")
    );
    assert_eq!(unit("/system.slice").as_deref(), Some("system.slice"));
    assert_eq!(unit("/"), None);
    assert_eq!(unit("/docker/abc"), None);
    // A container's view under the host (systemd-nspawn's payload): units inside.
    assert_eq!(
        unit("/machine.slice/systemd-nspawn@web.service/payload/system.slice/nginx.service").as_deref(),
        Some("systemd-nspawn@web.service")
    );
    assert_eq!(
        unit("/profilerd-test-1/payload/system.slice/a.service").as_deref(),
        Some("a.service")
    );
    // Names systemd never gives.
    assert_eq!(unit("/system.slice/a b.service").as_deref(), Some("system.slice"));
    assert_eq!(unit("/.service"), None);
    let long = format!("/{}.service", "a".repeat(300));
    assert_eq!(unit(&long), None);
}

#[test]
fn kubernetes_with_systemd_driver() {
    let path = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/cri-containerd-{DOCKER_ID}.scope"
    );
    assert_eq!(container_id_of(&path), Some(DOCKER_ID));
    assert_eq!(unit(&path), Some(format!("cri-containerd-{DOCKER_ID}.scope")));
    let crio = format!("/kubepods.slice/kubepods-pod1234.slice/crio-{DOCKER_ID}.scope");
    assert_eq!(container_id_of(&crio), Some(DOCKER_ID));
    // cri-o's monitor is not the container.
    assert_eq!(
        container_id_of(&format!(
            "/kubepods.slice/kubepods-pod1234.slice/crio-conmon-{DOCKER_ID}.scope"
        )),
        None
    );
}

#[test]
fn docker_and_podman() {
    assert_eq!(
        container_id_of(&format!("/system.slice/docker-{DOCKER_ID}.scope")),
        Some(DOCKER_ID)
    );
    assert_eq!(container_id_of(&format!("/docker/{DOCKER_ID}")), Some(DOCKER_ID));
    assert_eq!(
        container_id_of(&format!("/machine.slice/libpod-{DOCKER_ID}.scope/container")),
        Some(DOCKER_ID)
    );
    assert_eq!(
        container_id_of(&format!(
            "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{DOCKER_ID}.scope"
        )),
        Some(DOCKER_ID)
    );
    assert_eq!(
        container_id_of(&format!("/machine.slice/libpod-conmon-{DOCKER_ID}.scope")),
        None
    );
    assert_eq!(
        container_id_of(&format!("/libpod_parent/libpod-{DOCKER_ID}")),
        Some(DOCKER_ID)
    );
}

#[test]
fn kubernetes_with_cgroupfs_driver() {
    assert_eq!(
        container_id_of(&format!(
            "/kubepods/burstable/pod1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901/{DOCKER_ID}"
        )),
        Some(DOCKER_ID)
    );
    assert_eq!(
        container_id_of(&format!("/kubepods/pod1234/{DOCKER_ID}")),
        Some(DOCKER_ID)
    );
}

#[test]
fn the_outermost_container_wins_and_bad_ids_do_not_match() {
    // A container's delegated cgroups cannot pose as another container.
    assert_eq!(
        container_id_of(&format!(
            "/system.slice/docker-{DOCKER_ID}.scope/docker-{OTHER_ID}.scope"
        )),
        Some(DOCKER_ID)
    );
    assert_eq!(container_id_of("/system.slice/docker-abc.scope"), None);
    assert_eq!(
        container_id_of(&format!("/docker/{}", DOCKER_ID.to_uppercase())),
        None
    );
    assert_eq!(container_id_of(&format!("/docker/{}0", DOCKER_ID)), None);
    assert_eq!(container_id_of("/system.slice/nginx.service"), None);
    assert_eq!(container_id_of("/"), None);
}
