//! The canonical formatter (see module docs once written).
