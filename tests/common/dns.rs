//! One DNS question over UDP, as the DNS tests ask it: the answer's
//! response code and records, each file formatting what it asserts on.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// Asks `addr` for `name`'s `qtype` records (recursion desired, as `dig`
/// asks); panics if no answer comes within 10 s.
pub fn ask(addr: SocketAddr, name: &str, qtype: RecordType) -> (ResponseCode, Vec<Record>) {
    let mut q = Message::query();
    q.metadata.id = 7;
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sock.send_to(&q.to_vec().unwrap(), addr).unwrap();
    let mut buf = [0u8; 4096];
    let (n, _) = sock
        .recv_from(&mut buf)
        .unwrap_or_else(|e| panic!("no answer to {name}: {e}"));
    let m = Message::from_vec(&buf[..n]).unwrap();
    (m.metadata.response_code, m.answers)
}

/// The A records' addresses among `records`.
pub fn addresses(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.to_string()),
            _ => None,
        })
        .collect()
}

/// Dig's words for the common response codes.
pub fn status(code: ResponseCode) -> String {
    match code {
        ResponseCode::NoError => "NOERROR".to_string(),
        ResponseCode::NXDomain => "NXDOMAIN".to_string(),
        ResponseCode::ServFail => "SERVFAIL".to_string(),
        other => format!("{other:?}"),
    }
}
