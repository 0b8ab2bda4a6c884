//! Parsers of what the kernel writes in /proc/PID/maps and
//! /proc/PID/mountinfo (the process's owner shapes the paths in them, never
//! the fields around them).

use std::collections::HashSet;

use crate::procfs::ProcRoot;

/// One parsed line of /proc/PID/maps.
#[derive(Debug, PartialEq, Eq)]
pub struct MapsLine<'a> {
    pub start: u64,
    pub end: u64,
    pub executable: bool,
    pub offset: u64,
    /// The device as the kernel encodes it (what fstat's st_dev holds).
    pub dev: u64,
    pub inode: u64,
    pub path: &'a str,
}

/// Parses `start-end perms offset dev inode [path]`; None if malformed.
pub fn parse_maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut rest = line;
    let mut field = || {
        let trimmed = rest.trim_start();
        let end = trimmed.find(char::is_whitespace).unwrap_or(trimmed.len());
        let (field, tail) = trimmed.split_at(end);
        rest = tail;
        (!field.is_empty()).then_some(field)
    };
    let (start, end) = field()?.split_once('-')?;
    let perms = field()?;
    let offset = field()?;
    let (major, minor) = field()?.split_once(':')?;
    let inode = field()?;
    Some(MapsLine {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: libc::makedev(
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode: inode.parse().ok()?,
        path: rest.trim(),
    })
}

/// Devices of the FUSE mounts in the process's mount namespace (as the
/// kernel renders /proc/PID/mountinfo: `ID PARENT MAJOR:MINOR ... - FSTYPE ...`).
/// A process's mount table can be made huge by its owner (mounts in a user
/// namespace): past this, it is not parsed, and every anonymous device is
/// treated as possibly FUSE.
const MAX_MOUNTINFO_BYTES: u64 = 4 << 20;

/// Which devices of a process's mount namespace a user process may serve.
pub enum UserFilesystems {
    Known(HashSet<u64>),
    /// The mount table could not be read whole: assume the worst.
    Unknown,
}

impl UserFilesystems {
    pub fn of(proc: &ProcRoot, pid: u32) -> Self {
        use std::io::Read as _;
        let mut text = String::new();
        let read = std::fs::File::open(proc.file(pid, "mountinfo"))
            .and_then(|file| file.take(MAX_MOUNTINFO_BYTES + 1).read_to_string(&mut text));
        match read {
            Ok(len) if (len as u64) <= MAX_MOUNTINFO_BYTES => Self::Known(fuse_devices(&text)),
            _ => Self::Unknown,
        }
    }

    /// FUSE mounts have anonymous devices (major 0); fuseblk needs a block
    /// device, which only root can mount.
    pub fn contains(&self, dev: u64) -> bool {
        match self {
            Self::Known(devices) => devices.contains(&dev),
            Self::Unknown => libc::major(dev) == 0,
        }
    }
}

/// Whether a FUSE mount of the process's mount namespace lies on `path`
/// (absolute, as the process sees it: `/`, `/tmp` and `/tmp/x` all lie on
/// `/tmp/x`), where looking the path up would ask a user process that need
/// never answer; true when the mount table cannot be read whole.
pub fn fuse_on_path(proc: &ProcRoot, pid: u32, path: &str) -> bool {
    use std::io::Read as _;
    let mut text = String::new();
    let read = std::fs::File::open(proc.file(pid, "mountinfo"))
        .and_then(|file| file.take(MAX_MOUNTINFO_BYTES + 1).read_to_string(&mut text));
    match read {
        Ok(len) if (len as u64) <= MAX_MOUNTINFO_BYTES => fuse_mount_points(&text)
            .any(|mount| mount == "/" || mount == path || path.starts_with(&format!("{mount}/"))),
        _ => true,
    }
}

/// The mount points of the FUSE mounts in a mountinfo text (relative to the
/// process's root; spaces and such octal-escaped, as the kernel writes them).
fn fuse_mount_points(mountinfo: &str) -> impl Iterator<Item = &str> {
    mountinfo.lines().filter_map(|line| {
        let (fields, tail) = line.split_once(" - ")?;
        is_fuse(tail.split_whitespace().next()?).then_some(())?;
        fields.split_whitespace().nth(4)
    })
}

fn is_fuse(fstype: &str) -> bool {
    fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse.")
}

pub fn fuse_devices(mountinfo: &str) -> HashSet<u64> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (fields, tail) = line.split_once(" - ")?;
            if !is_fuse(tail.split_whitespace().next()?) {
                return None;
            }
            let (major, minor) = fields.split_whitespace().nth(2)?.split_once(':')?;
            Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuse_mount_points_are_found_by_type() {
        let mountinfo = "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
                         40 22 0:44 / /tmp rw - fuse.sshfs host: rw\n\
                         41 22 0:45 / /home/a\\040b rw - fuse /dev/fuse rw\n";
        assert_eq!(
            fuse_mount_points(mountinfo).collect::<Vec<_>>(),
            ["/tmp", "/home/a\\040b"]
        );
    }

    #[test]
    fn parses_file_backed_line() {
        let line = "55d4c2a00000-55d4c2a02000 r-xp 00002000 fd:01 1234567                    /usr/bin/my tool (deleted)";
        let parsed = parse_maps_line(line).expect("a valid maps line");
        assert_eq!(
            parsed,
            MapsLine {
                start: 0x55d4c2a00000,
                end: 0x55d4c2a02000,
                executable: true,
                offset: 0x2000,
                dev: libc::makedev(0xfd, 1),
                inode: 1234567,
                path: "/usr/bin/my tool (deleted)",
            }
        );
    }

    #[test]
    fn parses_anonymous_and_special_lines() {
        let anon = parse_maps_line("7ffd1000-7ffd3000 rw-p 00000000 00:00 0").expect("anonymous line");
        assert_eq!((anon.executable, anon.inode, anon.path), (false, 0, ""));
        let vdso = parse_maps_line("7fff0000-7fff2000 r-xp 00000000 00:00 0                  [vdso]")
            .expect("vdso line");
        assert_eq!((vdso.executable, vdso.path), (true, "[vdso]"));
    }

    #[test]
    fn fuse_mounts_are_found_by_device() {
        let mountinfo = "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
            40 22 0:44 / /home/u/mnt rw,nosuid,nodev shared:9 - fuse.sshfs host:/ rw,user_id=1000\n\
            41 22 0:45 / /tmp/x rw - tmpfs tmpfs rw\n\
            42 22 8:17 / /media/usb rw - fuseblk /dev/sdb1 rw\n\
            malformed line";
        let devices = fuse_devices(mountinfo);
        assert_eq!(
            devices,
            HashSet::from([libc::makedev(0, 44), libc::makedev(8, 17)])
        );
    }

    #[test]
    fn an_unreadable_mount_table_distrusts_every_anonymous_device() {
        let unknown = UserFilesystems::Unknown;
        assert!(unknown.contains(libc::makedev(0, 44)));
        assert!(!unknown.contains(libc::makedev(254, 1)));
        assert!(
            matches!(
                UserFilesystems::of(&ProcRoot::default(), std::process::id()),
                UserFilesystems::Known(_)
            ),
            "our own mount table is small and readable"
        );
        assert!(matches!(
            UserFilesystems::of(&ProcRoot::default(), u32::MAX),
            UserFilesystems::Unknown
        ));
    }

    #[test]
    fn rejects_malformed_lines() {
        for line in [
            "",
            "zzzz-1000 r-xp 0 00:00 0",
            "1000 r-xp 0 00:00 0",
            "1000-2000 r-xp",
        ] {
            assert_eq!(parse_maps_line(line), None, "{line:?} should not parse");
        }
    }
}
