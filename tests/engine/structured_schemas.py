"""Twenty-two pydantic models for the structured-output tests: nested objects, enums, arrays, optional and required
fields, numbers with bounds, unions. Strings and arrays are bounded so that a 270M model's greedy output ends within
the tests' max_tokens."""
from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, Field

Short = Field(max_length=24)


class Person(BaseModel):
    name: str = Short
    age: int = Field(ge=0, le=120)


class Point(BaseModel):
    x: float = Field(ge=-100, le=100)
    y: float = Field(ge=-100, le=100)


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Paint(BaseModel):
    color: Color
    liters: int = Field(ge=1, le=20)


class Address(BaseModel):
    street: str = Short
    city: str = Short
    zip_code: str = Field(pattern=r"^[0-9]{5}$")


class Customer(BaseModel):
    person: Person
    address: Address


class Order(BaseModel):
    order_id: int = Field(ge=1, le=99999)
    items: list[str] = Field(min_length=1, max_length=3)


class Flags(BaseModel):
    active: bool
    verified: bool


class Profile(BaseModel):
    username: str = Short
    nickname: Optional[str] = Field(default=None, max_length=16)


class Rating(BaseModel):
    score: int = Field(ge=1, le=5)
    comment: str = Field(max_length=40)


class Reading(BaseModel):
    celsius: float = Field(ge=-50, le=60)
    station: Literal["north", "south"]


class Book(BaseModel):
    title: str = Short
    author: Person
    year: int = Field(ge=1400, le=2100)


class Ticket(BaseModel):
    status: Literal["open", "closed", "pending"]
    assignee: Optional[Person] = None


class Grid(BaseModel):
    rows: list[Annotated[list[Annotated[int, Field(ge=0, le=9)]], Field(max_length=3)]] = Field(max_length=2)


class Event(BaseModel):
    name: str = Short
    attendees: int = Field(ge=0, le=1000)
    public: bool


class Product(BaseModel):
    name: str = Short
    price: float = Field(gt=0, le=10000)
    in_stock: bool


class Path(BaseModel):
    points: list[Point] = Field(min_length=1, max_length=3)


class Value(BaseModel):
    value: Union[Annotated[int, Field(ge=-1000, le=1000)], Annotated[str, Field(max_length=12)]]


class Priority(str, Enum):
    low = "low"
    medium = "medium"
    high = "high"


class Task(BaseModel):
    title: str = Short
    priority: Priority
    done: bool


class Forecast(BaseModel):
    city: str = Short
    days: list[Literal["sun", "rain", "snow"]] = Field(min_length=1, max_length=3)


class Answer(BaseModel):
    yes: bool
    reason: str = Field(max_length=40)


class Shipment(BaseModel):
    tracking: str = Field(pattern=r"^[A-Z]{2}[0-9]{4}$")
    weight_kg: float = Field(ge=0.1, le=50)
    destination: Optional[Address] = None


MODELS = [Person, Point, Paint, Address, Customer, Order, Flags, Profile, Rating, Reading, Book, Ticket, Grid, Event,
          Product, Path, Value, Task, Forecast, Answer, Shipment]


def prompt_for(model: type[BaseModel]) -> str:
    return f"Write one {model.__name__.lower()} as JSON."
