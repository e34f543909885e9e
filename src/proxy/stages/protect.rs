//! The protect stage: after the limits, so that a caller over its quota never takes a slot,
//! the app's protection (`crate::protect`) admits the request with a slot it gives back when
//! the app's response head arrives, or sheds it (503, see `answers`).

use crate::config::Priority;
use crate::protect::{Admission, Slot};
use crate::proxy::exchange::{self, UntilHead};
use crate::proxy::record::RequestRecord;
use crate::proxy::runtime::Runtime;
use crate::throttle::Admitted;

/// The request was shed: the app is overloaded and this one was chosen to keep it answering.
pub struct Shed;

/// The slot the request holds in the app (None without `protect`), or [`Shed`]. A shed
/// request's units are given back before the answer goes: it never reached the app.
pub async fn admit(
    runtime: &Runtime,
    admitted: Option<&mut Admitted<'_>>,
    record: &mut RequestRecord<'_>,
) -> Result<Option<Slot>, Shed> {
    let Some(protector) = &runtime.protect else {
        return Ok(None);
    };
    let priority = admitted
        .as_ref()
        .map_or(Priority::Normal, |a| a.set.priority);
    let admission = match protector.try_admit(priority) {
        Ok(admission) => admission,
        // Boxed: waiting is the rare case, and its timer would size every future.
        Err(ticket) => Box::pin(ticket.wait()).await,
    };
    match admission {
        Admission::Admitted(slot) => {
            if slot.would_shed() {
                record.shed(true);
            }
            Ok(Some(slot))
        }
        Admission::Shed => {
            record.shed(false);
            if let Some(mut owed) = admitted.and_then(|a| a.settlement.take()) {
                owed.report_to(record.settlement());
                Box::pin(owed.give_back()).await;
            }
            Err(Shed)
        }
    }
}

/// Gives back a protect slot with what the exchange showed: the head's status, or a failure
/// of the upstream's (a refusal of the client's own, such as an oversized body, is no sample).
impl UntilHead for Slot {
    /// The app's answer is the controller's sample: its latency and whether it failed.
    fn answered(self: Box<Self>, answered: &exchange::Answered) {
        match answered {
            Ok(response) => self.finish(Some(response.status())),
            Err(error) if error.side() == crate::error::Side::Upstream => self.finish(None),
            Err(_) => drop(self),
        }
    }
}
