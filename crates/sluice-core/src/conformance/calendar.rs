//! Fixed windows on the calendar: days, ISO weeks, months and years in a
//! time zone, across clock changes, month ends, leap days and year ends.

use super::agreement::agree_with_the_model;
use super::*;

/// The checks of calendar windows. They move the clock to dates in 2026
/// and 2028 (never back), so they run after the others.
pub async fn run_calendar<St: Store>(store: &St, clock: &FakeClock) {
    a_month_is_as_long_as_it_is_across_a_dst_change(store, clock).await;
    a_monthly_quota_renews_at_local_midnight(store, clock).await;
    a_daily_quota_admits_once_over_the_day_clocks_go_back(store, clock).await;
    an_iso_week_runs_on_across_new_year(store, clock).await;
    a_yearly_quota_renews_at_local_new_year(store, clock).await;
    a_leap_day_ends_its_month(store, clock).await;
    a_change_of_kind_to_the_calendar_never_grants_a_burst(store, clock).await;
    calendar_windows_agree_with_the_pure_algorithm(store, clock).await;
}

/// Moves the clock forward to `secs` after the epoch.
fn jump_to(clock: &FakeClock, secs: i64) {
    let at = Nanos(secs * S);
    assert!(
        clock.now() <= at,
        "the calendar checks never move the clock back"
    );
    clock.set(at);
}

fn calendar_limit(name: &str, rate: f64, unit: CalendarUnit, zone: &str) -> Limit {
    let cal = Calendar::new(unit, zone).unwrap();
    Limit::new(name, FixedWindow::on_calendar(rate, cal).unwrap())
}

/// Spends `n` calls of cost 1 on `key`, all admitted, then one more that is
/// denied with `retry_after` of `wait` seconds.
async fn spend_then_wait<St: Store>(store: &St, l: &Limit, key: &str, n: u64, wait: f64) {
    for i in 0..n {
        let d = one(store, l, key, 1.0, Mode::CONSUME).await;
        assert!(d.allowed, "{}: call {i} of {n}", l.name());
        assert_eq!(d.remaining, n - 1 - i);
    }
    let d = one(store, l, key, 1.0, Mode::CONSUME).await;
    assert!(!d.allowed, "{}: call {n} is one too many", l.name());
    assert_eq!(d.retry_after, Some(wait), "{}: retry_after", l.name());
    assert_eq!(d.reset, wait, "{}: reset", l.name());
}

/// Berlin's March 2026 lasts 31 days less the hour summer time takes: a
/// window of 30 days would renew a day early, one of 31 an hour late.
pub async fn a_month_is_as_long_as_it_is_across_a_dst_change<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let l = calendar_limit("conf-cal-march", 5.0, CalendarUnit::Month, "Europe/Berlin");
    // 2026-03-01T00:00:00+01:00.
    jump_to(clock, 1_772_319_600);
    spend_then_wait(store, &l, "k", 5, (31 * 86_400 - 3_600) as f64).await;
}

/// A monthly quota of 100 in Europe/Berlin admits 100 on 31 March at
/// 23:59:59 local time and 100 more from 1 April at 00:00:00 local time,
/// two days after the clocks went forward.
pub async fn a_monthly_quota_renews_at_local_midnight<St: Store>(store: &St, clock: &FakeClock) {
    let l = calendar_limit(
        "conf-cal-month",
        100.0,
        CalendarUnit::Month,
        "Europe/Berlin",
    );
    // 2026-03-31T23:59:59+02:00.
    jump_to(clock, 1_774_994_399);
    spend_then_wait(store, &l, "org", 100, 1.0).await;
    step(clock, S);
    // April has 30 days of summer time.
    spend_then_wait(store, &l, "org", 100, (30 * 86_400) as f64).await;
}

/// On 25 October 2026 Berlin's clocks go back an hour: the day lasts 25
/// hours and its quota is admitted once in them.
pub async fn a_daily_quota_admits_once_over_the_day_clocks_go_back<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let l = calendar_limit("conf-cal-day", 10.0, CalendarUnit::Day, "Europe/Berlin");
    // 2026-10-25T00:00:00+02:00.
    jump_to(clock, 1_792_879_200);
    spend_then_wait(store, &l, "k", 10, 25.0 * 3_600.0).await;
    // Where a day of 24 hours would have renewed it.
    step(clock, 24 * 3_600 * S);
    let d = one(store, &l, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed, "still the 25-hour day");
    assert_eq!(d.retry_after, Some(3_600.0));
    step(clock, 3_600 * S);
    spend_then_wait(store, &l, "k", 10, 24.0 * 3_600.0).await;
}

/// An ISO week starts on a Monday: the week from Monday 28 December 2026
/// runs on into January, and renews on Monday 4 January.
pub async fn an_iso_week_runs_on_across_new_year<St: Store>(store: &St, clock: &FakeClock) {
    let l = calendar_limit("conf-cal-week", 3.0, CalendarUnit::Week, "UTC");
    // Thursday 2026-12-31T12:00:00Z.
    jump_to(clock, 1_798_718_400);
    spend_then_wait(store, &l, "k", 3, (3 * 86_400 + 12 * 3_600) as f64).await;
    // New Year's Day renews nothing.
    step(clock, 12 * 3_600 * S + S);
    let d = one(store, &l, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some((3 * 86_400 - 1) as f64));
}

/// A yearly quota in New York renews at midnight there, five hours after
/// midnight in UTC, and lasts the year's 365 days.
pub async fn a_yearly_quota_renews_at_local_new_year<St: Store>(store: &St, clock: &FakeClock) {
    let l = calendar_limit("conf-cal-year", 2.0, CalendarUnit::Year, "America/New_York");
    // 2026-12-31T23:59:59-05:00.
    jump_to(clock, 1_798_779_599);
    spend_then_wait(store, &l, "k", 2, 1.0).await;
    step(clock, S);
    spend_then_wait(store, &l, "k", 2, (365 * 86_400) as f64).await;
}

/// February 2028 ends on its 29th; unused tokens roll over into March up to
/// the capacity, and a reservation waits for the window that repays it.
pub async fn a_leap_day_ends_its_month<St: Store>(store: &St, clock: &FakeClock) {
    let cal = Calendar::new(CalendarUnit::Month, "UTC").unwrap();
    let fw = FixedWindow::on_calendar(4.0, cal)
        .unwrap()
        .with_capacity(6.0)
        .unwrap()
        .with_max_reserved(4.0)
        .unwrap();
    let l = Limit::new("conf-cal-leap", fw);
    // 2028-02-29T12:00:00Z, twelve hours before March.
    jump_to(clock, 1_835_438_400);
    let d = one(store, &l, "k", 3.0, Mode::CONSUME).await;
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset), (3, 12.0 * 3_600.0));
    step(clock, 12 * 3_600 * S);
    // 3 left and 4 more, up to the capacity of 6.
    let d = one(store, &l, "k", 0.0, Mode::CHECK).await;
    assert_eq!(d.remaining, 6);
    // Taking 8 reserves 2 of April's 4: the wait is March's 31 days.
    let d = one(store, &l, "k", 8.0, Mode::RESERVE).await;
    assert!(d.allowed);
    assert_eq!(d.retry_after, Some((31 * 86_400) as f64));
    // Two months to be full again: from -2, April brings 4, May 4 more.
    assert_eq!(d.reset, ((31 + 30) * 86_400) as f64);
}

/// A key exhausted under a sliding log, then decided by a daily calendar
/// window of the same name, waits for the next midnight, and one exhausted
/// by the calendar waits under a log.
pub async fn a_change_of_kind_to_the_calendar_never_grants_a_burst<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let day = calendar_limit("conf-cal-kind", 3.0, CalendarUnit::Day, "Europe/Berlin");
    let log = Limit::new(
        "conf-cal-kind",
        SlidingLog::per_period(3.0, Nanos(60 * S)).unwrap(),
    );
    // 2028-03-02T12:00:00+01:00.
    jump_to(clock, 1_835_607_600);
    for _ in 0..3 {
        assert!(one(store, &log, "k", 1.0, Mode::CONSUME).await.allowed);
    }
    let d = one(store, &day, "k", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed, "the log's state still counts: {d:?}");
    assert_eq!(
        d.retry_after,
        Some(12.0 * 3_600.0),
        "until midnight in Berlin"
    );
    // (Not stepped to midnight: a Redis key expires in Redis's time, which
    // a fake clock does not move.)
    spend_then_wait(store, &day, "k2", 3, 12.0 * 3_600.0).await;
    let d = one(store, &log, "k2", 1.0, Mode::CONSUME).await;
    assert!(!d.allowed, "the calendar's state still counts: {d:?}");
}

/// Random calls on a daily quota across Berlin's clock change of March 2028
/// and a monthly one in New York, decided as the pure algorithm decides.
pub async fn calendar_windows_agree_with_the_pure_algorithm<St: Store>(
    store: &St,
    clock: &FakeClock,
) {
    let berlin = Calendar::new(CalendarUnit::Day, "Europe/Berlin").unwrap();
    let new_york = Calendar::new(CalendarUnit::Month, "America/New_York").unwrap();
    let algs: [Algorithm; 2] = [
        FixedWindow::on_calendar(4.0, berlin)
            .unwrap()
            .with_max_reserved(3.0)
            .unwrap()
            .into(),
        FixedWindow::on_calendar(5.0, new_york)
            .unwrap()
            .with_capacity(7.0)
            .unwrap()
            .with_max_reserved(6.0)
            .unwrap()
            .into(),
    ];
    // 2028-03-20T00:00:00Z: Berlin's clocks go forward on the 26th, New
    // York's went on the 12th and go back in November.
    jump_to(clock, 1_837_123_200);
    let hour = 3_600 * S;
    let steps = [0, S, hour, 7 * hour, 25 * hour];
    let costs = [1.0, 2.0, 3.5];
    agree_with_the_model(
        store,
        clock,
        &algs,
        "conf-cal-model",
        (&steps, &costs),
        11,
        500,
    )
    .await;
}
