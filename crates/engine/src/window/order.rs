//! The window's entries in acknowledgement order, each reachable by a
//! stable id in constant time.
//!
//! A new entry always has the newest sequence number, so it goes at the
//! back; what a punch leaves of an entry keeps its number and takes its
//! place. The order is thus kept by construction, and the oldest entry (the
//! first to shed, the first a FLUSH covers) is always at the front: no
//! search tree is needed for it. Under 4 KiB random writes that never
//! flush (fio QD32 through `braid attach`), replacing the B-tree keyed by
//! (seq, offset) that was here cut the window's share of attach's CPU
//! samples from about 20% to 14%.

/// No entry: the end of the chain.
const NIL: usize = usize::MAX;

/// An entry and its neighbours in the chain.
#[derive(Debug)]
struct Link<T> {
    value: T,
    prev: usize,
    next: usize,
}

/// Entries in acknowledgement order, in slots reused once freed.
#[derive(Debug)]
pub(super) struct AckOrder<T> {
    slots: Vec<Option<Link<T>>>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
    len: usize,
}

impl<T> AckOrder<T> {
    pub(super) fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The oldest entry's id.
    pub(super) fn front(&self) -> Option<usize> {
        (self.head != NIL).then_some(self.head)
    }

    /// Adds `value` as the newest entry.
    pub(super) fn push_back(&mut self, value: T) -> usize {
        let prev = self.tail;
        self.link(value, prev, NIL)
    }

    /// Adds `value` just after entry `after`, or at the front if `None`.
    pub(super) fn insert_after(&mut self, after: Option<usize>, value: T) -> usize {
        let prev = after.unwrap_or(NIL);
        let next = match after {
            Some(a) => self.at(a).next,
            None => self.head,
        };
        self.link(value, prev, next)
    }

    fn link(&mut self, value: T, prev: usize, next: usize) -> usize {
        let node = Some(Link { value, prev, next });
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id] = node;
                id
            }
            None => {
                self.slots.push(node);
                self.slots.len() - 1
            }
        };
        match prev {
            NIL => self.head = id,
            p => self.at_mut(p).next = id,
        }
        match next {
            NIL => self.tail = id,
            n => self.at_mut(n).prev = id,
        }
        self.len += 1;
        id
    }

    /// Takes entry `id` out; returns it and the entry before it (where
    /// what replaces it goes).
    pub(super) fn remove(&mut self, id: usize) -> (T, Option<usize>) {
        let link = self.slots[id].take().expect("a live entry");
        match link.prev {
            NIL => self.head = link.next,
            p => self.at_mut(p).next = link.next,
        }
        match link.next {
            NIL => self.tail = link.prev,
            n => self.at_mut(n).prev = link.prev,
        }
        self.free.push(id);
        self.len -= 1;
        (link.value, (link.prev != NIL).then_some(link.prev))
    }

    pub(super) fn get(&self, id: usize) -> &T {
        &self.at(id).value
    }

    pub(super) fn get_mut(&mut self, id: usize) -> &mut T {
        &mut self.at_mut(id).value
    }

    /// Oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        let mut at = self.head;
        std::iter::from_fn(move || {
            let link = self.slots.get(at)?.as_ref()?;
            at = link.next;
            Some(&link.value)
        })
    }

    fn at(&self, id: usize) -> &Link<T> {
        self.slots[id].as_ref().expect("a live entry")
    }

    fn at_mut(&mut self, id: usize) -> &mut Link<T> {
        self.slots[id].as_mut().expect("a live entry")
    }
}

#[cfg(test)]
mod tests {
    use super::AckOrder;

    fn all(o: &AckOrder<u32>) -> Vec<u32> {
        o.iter().copied().collect()
    }

    #[test]
    fn entries_keep_their_places_as_others_come_and_go() {
        let mut o = AckOrder::new();
        let a = o.push_back(1);
        let b = o.push_back(2);
        let c = o.push_back(3);
        assert_eq!(all(&o), [1, 2, 3]);
        // What replaces b goes where b was, in order.
        let (v, before) = o.remove(b);
        assert_eq!((v, before), (2, Some(a)));
        let left = o.insert_after(before, 20);
        o.insert_after(Some(left), 21);
        assert_eq!(all(&o), [1, 20, 21, 3]);
        // The front, taken and replaced at the front.
        assert_eq!(o.front(), Some(a));
        let (_, before) = o.remove(a);
        assert_eq!(before, None);
        o.insert_after(None, 10);
        assert_eq!(all(&o), [10, 20, 21, 3]);
        // Freed slots are reused, and the order still holds.
        let d = o.push_back(4);
        assert!(d <= 4, "slot {d} is new though two were freed");
        *o.get_mut(c) = 30;
        assert_eq!(all(&o), [10, 20, 21, 30, 4]);
        assert_eq!(*o.get(d), 4);
        while let Some(f) = o.front() {
            o.remove(f);
        }
        assert!(o.is_empty() && all(&o).is_empty());
        o.push_back(5);
        assert_eq!(all(&o), [5]);
    }
}
